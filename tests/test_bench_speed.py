"""Smoke tests of bench/speed.py at tiny sizes: the model definitions, that the skip path really skips the
block stack, and that the script's JSON line comes out."""
import functools
import json
import math

import pytest
import torch

from gcache.bench import speed, speed_harness, speed_models
from gcache.core import ResidualCache

TINY = {"flux": speed_models.FluxSize(width=32, heads=2, double=1, single=2, lat_h=8, lat_w=8, txt_tokens=6, ctx_dim=16,
                               vec_dim=8),
        "wan": speed_models.WanSize(width=32, heads=2, depth=2, ffn=64, frames=2, lat_h=4, lat_w=6, txt_tokens=5,
                                    ctx_dim=16,
                             freq_dim=16)}


def _model(family):
    model, _ = speed_harness.build(family, TINY[family], torch.device("cpu"), torch.float32, use_comfy=False)
    return model


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_shapes_and_all_ones_is_bit_identical(family):
    model = _model(family)
    inp = model.inputs("cpu", torch.float32)
    t = torch.full((inp["x"].shape[0],), 0.7)
    with torch.inference_mode():
        plain = speed_harness.forward(model, inp["x"], t, inp, lambda h, b, blocks: blocks(h))
        cache = ResidualCache([1, 1])
        cache.set_step(0)
        cached = speed_harness.forward(model, inp["x"], t, inp, cache.run)
        cache.close()
    assert plain.shape == inp["x"].shape
    assert torch.isfinite(plain).all()
    assert torch.equal(plain, cached)


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_skip_path_skips_the_blocks(family):
    model = _model(family)
    calls = []
    real = model.blocks
    model.blocks = lambda h, st: calls.append(h.shape) or real(h, st)
    bench = speed_harness.Bench(model, torch.device("cpu"), torch.float32, 6, None)
    with torch.inference_mode():
        bench.run("none")
        assert len(calls) == 6
        for variant, k in (("half", 3), ("third", 2), ("skip", 1), ("io", 0), ("ones", 6), ("profile", 6)):
            calls.clear()
            bench.run(variant)
            assert len(calls) == k, variant
    stats = bench.last_stats["half"]
    assert stats.computed_steps == 3 and stats.skipped_steps == 3
    assert set(stats.block_runs.values()) == {3}
    assert len(stats.block_runs) == len(model.branches)  # Wan: cond and uncond cached separately


def test_skipped_step_adds_the_cached_residual():
    model = _model("flux")
    inp = model.inputs("cpu", torch.float32)
    x1 = inp["x"] * 0.5
    t0, t1 = torch.full((1,), 1.0), torch.full((1,), 0.5)
    with torch.inference_mode():
        cache = ResidualCache([1, 0])
        cache.set_step(0)
        speed_harness.forward(model, inp["x"], t0, inp, cache.run)
        h0, st0 = model.f_in(inp["x"], t0, **{k: v for k, v in inp.items() if k != "x"})
        delta = model.blocks(h0, st0) - h0
        cache.set_step(1)
        got = speed_harness.forward(model, x1, t1, inp, cache.run)
        h1, st1 = model.f_in(x1, t1, **{k: v for k, v in inp.items() if k != "x"})
        want = model.f_out(h1 + delta, st1)
        cache.close()
    torch.testing.assert_close(got, want)


def test_uniform_mask():
    for n in (6, 12, 30):
        for k in (n // 2, n // 3):
            m = speed_harness.uniform_mask(n, k)
            assert len(m) == n and m[0] == 1 and sum(m) == k


def test_memory_formula():
    p = speed_harness.predicted_profile_bytes(numel_branch=1000, itemsize=2, n=10, branches=2, chunk_elems=3000)
    # float32 differences of 3 rows, the 3 rows copied from the host in bfloat16, δ in float32
    assert p["history"] == 2 * 10 * 2000 and p["row_temps"] == 3 * 1000 * 4 + 3 * 2000 + 1000 * 4
    p32 = speed_harness.predicted_profile_bytes(numel_branch=1000, itemsize=4, n=10, branches=2, chunk_elems=3000)
    assert p32["row_temps"] == 2 * 3 * 4000
    assert p["total"] == p["history"] + p["prev_h"] + p["delta_batch"] + p["row_temps"]


def test_script_ends_with_one_json_line_holding_every_model(monkeypatch, capsys):
    monkeypatch.setattr(speed_harness, "QUICK", TINY)
    try:
        lines = speed.main(["--quick", "--reps", "1", "--steps", "6", "--threads", "1"])
    finally:
        torch.set_flush_denormal(False)  # main() flushes denormals process-wide: not into the tests that follow
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == {"models": lines} and len(lines) == 2
    assert not any(s.startswith("{") for s in out[:-1])  # no other JSON line before it
    keys = ["device", "model", "overhead_all_ones", "speedup_ratio_half", "speedup_ratio_third",
            "profile_step_overhead", "profile_peak_extra_gb"]
    for line, fam in zip(lines, ("flux", "wan")):
        assert list(line)[:7] == keys
        assert line["model"] == fam + "-quick"
        assert all(math.isfinite(line[k]) for k in keys[2:])
        assert line["profile_peak_extra_gb"] > 0  # the recorder's history at least


@pytest.mark.parametrize("family", ["flux", "wan"])
@pytest.mark.parametrize("max_elems", [64, 100, None])
def test_memory_formula_holds_what_the_recorder_keeps(family, max_elems):
    """Above max_elems the recorder keeps every stride-th element, the stride coprime with the width (so it depends
    on the width): the formula's held bytes equal the recorder's own peak_bytes, sampled or not. (On the GPU at Wan
    2.1-1.3B's real size the formula once assumed every element kept and called 460.7 MiB below a 671.8 MiB floor.)"""
    model = _model(family)
    bench = speed_harness.Bench(model, torch.device("cpu"), torch.float32, 6, None)
    kw = {} if max_elems is None else {"max_elems": max_elems}
    with torch.inference_mode():
        real = speed_harness.ProfileRecorder
        speed_harness.ProfileRecorder = functools.partial(real, **kw)
        try:
            bench.run("profile")
        finally:
            speed_harness.ProfileRecorder = real
        inp = bench.inp
        h, _ = model.f_in(inp["x"], torch.zeros(inp["x"].shape[0]), **{k: v for k, v in inp.items() if k != "x"})
    rec = bench.last_recorder
    p = speed_harness.profile_formula(h, 6, len(model.branches), rec)
    numel = h.numel() // len(model.branches)
    assert (p["stride"] > 1) == (max_elems is not None and numel > max_elems)
    if p["stride"] > 1:
        assert math.gcd(p["stride"], h.shape[-1]) == 1 and p["kept_elements"] <= max_elems
        if max_elems == 64:  # a stride that shares a factor with the width: what a width-blind formula got wrong
            assert p["stride"] != -(-numel // max_elems)
    assert rec.peak_bytes == p["history"] + p["prev_h"]
