"""The headless demo and the engine benchmark run end to end (tiny settings) and write what they promise."""
import json
import math

import numpy as np
import pytest

from gcache.bench import engine as bench_engine
from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.reference_model import demo
from gcache.reference_model.harness import ReferenceHarness
from gcache.search.dp import dp_mask
from gcache.search.infra.objectives import ssim


def test_demo_writes_profile_policy_grid(tmp_path, capsys):
    demo.main(["--steps", "8", "--k", "4", "--profile-seeds", "2", "--eval-seeds", "2", "--repeats", "1",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "N = 8, K = 4" in out and "PSNR" in out and "measured" in out
    pol = Policy.load(str(tmp_path / "policy.json"))
    prof = Profile.load(str(tmp_path / "profile.safetensors"))
    assert prof.count == 2  # 1 run × 2 CFG branches
    assert pol.n_steps == 8 and pol.mask == dp_mask(prof.E, np.zeros(8), 4)[0]  # the local DP on the written profile
    # the quality it wrote is the quality of that mask on its held-out seeds, recomputed here
    h = ReferenceHarness(8)
    full, (fast, _) = h.full([1000, 1001]), h.run([1000, 1001], mask=pol.mask)
    mse = float(((fast - full) ** 2).mean())
    assert mse > 0 and pol.metrics["psnr"] == pytest.approx(10 * math.log10(1 / mse), abs=1e-3)
    assert pol.metrics["ssim"] == pytest.approx(ssim(fast, full), abs=1e-4)
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"


def test_engine_bench_ends_with_json(capsys):
    bench_engine.main(["--steps", "6", "--batch", "1", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    row = json.loads(lines[-1])
    for key in ("overhead_all_ones", "speedup_half", "ideal_half", "speedup_ratio", "profile_peak_extra_mb"):
        assert key in row
    n6 = row["by_n"]["6"]  # one step count: the worst figures are its figures, and what its line printed
    assert [row[k] for k in ("speedup_half", "ideal_half", "speedup_ratio")] == \
        [n6[k] for k in ("speedup_half", "ideal_half", "speedup_ratio")]
    printed = next(ln for ln in lines if "N=  6 K=  3" in ln)  # after its progress prefix
    assert f"speed-up at K=N/2 {n6['speedup_half']:.3f}x vs ideal {n6['ideal_half']:.3f}x" in printed
