"""Every family in ComfyUI's own model classes (tiny random weights), at cfg 1 and cfg > 1.

For each family: the adapter chosen; all-ones bit-identical to the unpatched model; a K < N policy runs the
block stack exactly K times per branch; on every skipped step the stack's output equals h + the true δ of the
last computed step; Profile's E equals the E built from the true δ. The true δ is observed from outside GCache:
a copy of the stack input made before GCache's first block patch sees it (the check that catches blocks that
add into their input in place, LTXV and Chroma), and the image tokens of the last block's output.
"""
import pytest

from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from comfy.patcher_extension import WrappersMP  # noqa: E402

import tiny_image_models as tim  # noqa: E402
import tiny_models as tm  # noqa: E402
import tiny_video_models as tvm  # noqa: E402

from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes import apply_mode, hooks, profile_mode  # noqa: E402
from gcache.nodes.adapters import Route, block_slots  # noqa: E402
from gcache.nodes.streams import Layout  # noqa: E402

N = 6
MASK = [1, 0, 0, 1, 0, 1]  # K = 3: a skip after every computed step, two skips in a row once

# name -> (builder(tmpdir), first block actually called, adapter expected)
FAMILIES = {
    "flux": (lambda d: tm.flux(), "double_blocks.0", "flux"),
    "wan21": (tm.wan, "blocks.0", "wan"),
    "hunyuan_video": (tm.hunyuan_video, "double_blocks.0", "hunyuan_video"),
    "lumina2": (lambda d: tm.lumina2(), "layers.0", "lumina2"),
}
for _mod in (tim, tvm):
    for _name, _build in _mod.BUILDERS.items():
        FAMILIES[_name] = (_build, _mod.FIRST_BLOCK[_name], _mod.EXPECTED_FAMILY[_name])
_BUILT: dict = {}


@pytest.fixture(scope="module")
def unet_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("matrix_unets"))


def build(name, unet_dir):
    if name not in _BUILT:
        _BUILT[name] = FAMILIES[name][0](unet_dir)
    return _BUILT[name]


def ksample(model, pos, neg, lat, cfg, **kw):
    return comfy_nodes.common_ksampler(model, 0, N, cfg, "euler", "simple", pos, neg, {"samples": lat},
                                       **kw)[0]["samples"]


def config_of(model):
    return hooks.config_of(model)


class StackObserver:
    """Records, per model call of a GCache-patched clone, from outside GCache: the branches
    (cond_or_uncond), the batch, whether the first block's modules really ran, a copy of the stack input
    made before GCache saw it, and the image tokens of the stack's output (batch first)."""

    def __init__(self, patched, first_block: str):
        self.model = patched.clone()
        self.calls: list[dict] = []
        self.cur: dict = {}
        self.adapter = ad = config_of(self.model).adapter
        dm = self.model.get_model_object("diffusion_model")
        # the block's own modules (not the block: an object-patched block is called on skips too)
        watched = list(dm.get_submodule(first_block).modules())[1:] if ad.route != Route.FALLBACK else [dm]
        self.hooks = [m.register_forward_pre_hook(self._ran) for m in watched]
        # outermost APPLY_MODEL wrapper: marks calls, and is the stack itself for the whole-model fallback
        w = self.model.wrappers
        w[WrappersMP.APPLY_MODEL] = {"observer": [self._apply_model], **w.get(WrappersMP.APPLY_MODEL, {})}
        for slot in block_slots(ad, dm):
            if ad.route == Route.DIT:
                fn = self.model.model_options["transformer_options"]["patches_replace"]["dit"][(slot.stack.key,
                                                                                               slot.index)]
                self.model.set_model_patch_replace(self._dit(fn, slot), "dit", slot.stack.key, slot.index)
            else:
                name = f"diffusion_model.{slot.stack.attr}.{slot.child}.forward"
                self.model.add_object_patch(name, self._object(self.model.object_patches[name], slot))

    def _ran(self, module, args):
        if self.cur:
            self.cur["ran"] = True

    def _apply_model(self, executor, *args, **kwargs):
        topts = args[5] if len(args) > 5 else kwargs.get("transformer_options", {})
        x = args[0]
        self.cur = {"cou": tuple(topts.get("cond_or_uncond") or ()), "batch": x.shape[0], "ran": False,
                    "h": None, "z": None}
        if self.adapter.route == Route.FALLBACK:
            self.cur["h"] = x.clone()
        out = executor(*args, **kwargs)
        if self.adapter.route == Route.FALLBACK:
            self.cur["z"] = out.clone()
        self.calls.append(self.cur)
        self.cur = {}
        return out

    def _enter(self, h):
        if self.cur.get("h") is None:
            self.cur["h"] = packed(h).clone()

    def _leave(self, stream, layout, img_slice=None):
        """The image tokens of the last block's output, cut where ComfyUI says they are (its img_slice, since
        2026), else where the family table says (ComfyUI 0.3.64 sets none): not with GCache's own cut."""
        n = self.cur["h"].shape[1]
        if isinstance(stream, (tuple, list)) or layout == Layout.IMG or layout == Layout.ALL:
            z = packed(stream)
        elif img_slice is not None:
            z = stream[:, img_slice[0]:img_slice[1]]
        else:
            z = stream[:, stream.shape[1] - n:] if layout == Layout.TXT_FIRST else stream[:, :n]
        self.cur["z"] = z.clone()

    def _dit(self, fn, slot):
        def observed(args, extra):
            self._enter(args["img"])
            out = fn(args, extra)
            self._leave(out["img"], slot.stack.layout, (args.get("transformer_options") or {}).get("img_slice"))
            return out
        return observed

    def _object(self, fn, slot):
        arg, bd = slot.stack.call.arg, slot.stack.call.batch_dim

        def engine(t):
            return t.movedim(bd, 0) if bd else t

        def observed(*a, **kw):
            self._enter(engine(kw[arg] if isinstance(arg, str) else a[arg]))
            out = fn(*a, **kw)
            self._leave(engine(out[0] if isinstance(out, tuple) else out), slot.stack.layout)
            return out
        return observed

    def close(self):
        for h in self.hooks:
            h.remove()


def packed(stream):
    """A stream's tokens, batch first: a tuple of streams (LTX-2's video and audio) flattened side by side."""
    if isinstance(stream, (tuple, list)):
        return torch.cat([t.reshape(t.shape[0], -1) for t in stream], 1)
    return stream


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def skip_errors(calls):
    """Relative error of each skipped call's output against h + the true δ of the branch's last computed call."""
    last, errs = {}, []
    for c in calls:
        if c["ran"]:
            last[c["cou"]] = c["z"] - c["h"]
        else:
            errs.append(rel(c["z"], c["h"] + last[c["cou"]]))
    return errs


def true_E(calls):
    """E[i, j] = mean over branches of mean |δ_i − δ_j| from the observed δ (one call per euler step)."""
    deltas = [c["z"] - c["h"] for c in calls]
    n_branches = max(1, len(calls[0]["cou"]))
    E = torch.zeros(len(deltas), len(deltas), dtype=torch.float64)
    for b in range(n_branches):
        parts = [d.chunk(n_branches, 0)[b].double() for d in deltas]
        for i in range(len(parts)):
            for j in range(len(parts)):
                E[i, j] += (parts[i] - parts[j]).abs().mean().item() / n_branches
    return E


def apply(model, mask):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask))))


def profile(model, path):
    return hooks.patch_model(model, profile_mode.profile_config(model, path))


CASES = [(name, cfg) for name in FAMILIES for cfg in (1.0, 3.0)]


@pytest.mark.parametrize("name,cfg", CASES, ids=[f"{n}-cfg{c:g}" for n, c in CASES])
def test_family(name, cfg, unet_dir, tmp_path):
    model, pos, neg, lat = build(name, unet_dir)
    _, first_block, expected = FAMILIES[name]
    branches = 1 if cfg == 1.0 else 2

    # the adapter chosen
    assert config_of(apply(model, MASK)).adapter.name == expected

    # all ones: bit-identical to the unpatched model
    plain = ksample(model, pos, neg, lat, cfg)
    assert torch.equal(plain, ksample(apply(model, [1] * N), pos, neg, lat, cfg))

    # K < N: the stack runs K times per branch; each skipped step outputs h + the last computed true δ
    obs = StackObserver(apply(model, MASK), first_block)
    try:
        out = ksample(obs.model, pos, neg, lat, cfg)
    finally:
        obs.close()
    assert sum(c["batch"] for c in obs.calls if c["ran"]) == sum(MASK) * branches * lat.shape[0]
    assert [c["ran"] for c in obs.calls] == [bool(v) for v in MASK]
    errs = skip_errors(obs.calls)
    assert len(errs) == N - sum(MASK) and max(errs) < 1e-5, f"skip output vs h + true δ: {errs}"
    assert torch.isfinite(out).all() and not torch.equal(out, plain)

    # Profile: E equals the E built from the true δ
    path = str(tmp_path / f"{name}.profile.safetensors")
    obs = StackObserver(profile(model, path), first_block)
    try:
        assert torch.equal(ksample(obs.model, pos, neg, lat, cfg), plain)
    finally:
        obs.close()
    prof = Profile.load(path)
    assert prof.count == branches
    E = true_E(obs.calls)
    assert torch.allclose(torch.from_numpy(prof.E), E, rtol=1e-4, atol=1e-7), \
        f"profile E vs true E: max rel {((torch.from_numpy(prof.E) - E).abs() / E.clamp_min(1e-12)).max():.3g}"


# ------------------------------------------------------------------------------ Wan 2.2 14B: two experts
@pytest.fixture(scope="module")
def wan22_experts(unet_dir):
    return tvm.wan22_14b(unet_dir)


def split(m_hi, m_lo, pos, neg, lat, cfg):
    a = ksample(m_hi, pos, neg, lat, cfg, start_step=0, last_step=3, force_full_denoise=False)
    return ksample(m_lo, pos, neg, a, cfg, start_step=3, last_step=N, disable_noise=True)


def observed_split(patched_hi, patched_lo, first, pos, neg, lat, cfg):
    """The split run with both experts observed: (high-noise calls, low-noise calls)."""
    ohi, olo = StackObserver(patched_hi, first), StackObserver(patched_lo, first)
    try:
        split(ohi.model, olo.model, pos, neg, lat, cfg)
    finally:
        ohi.close()
        olo.close()
    return ohi.calls, olo.calls


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_wan22_14b_two_experts_one_policy_one_profile(wan22_experts, cfg, tmp_path):
    hi, lo, pos, neg, lat = wan22_experts
    first = tvm.FIRST_BLOCK["wan22_14b"]
    branches = 1 if cfg == 1.0 else 2
    assert config_of(apply(hi, MASK)).adapter.name == config_of(apply(lo, MASK)).adapter.name == "wan"
    plain = split(hi, lo, pos, neg, lat, cfg)
    assert torch.equal(plain, split(apply(hi, [1] * N), apply(lo, [1] * N), pos, neg, lat, cfg))

    # one policy over the global 6 steps: the high-noise expert runs steps 0-2, the low-noise one 3-5. The
    # policy skips step 3, but the low-noise expert has no residual of its own yet (the other model's δ would
    # be wrong), so step 3 is computed.
    mask = [1, 0, 1, 0, 0, 1]
    chi, clo = observed_split(apply(hi, mask), apply(lo, mask), first, pos, neg, lat, cfg)
    assert [c["ran"] for c in chi] == [True, False, True]
    assert [c["ran"] for c in clo] == [True, False, True]
    assert sum(c["batch"] for c in chi + clo if c["ran"]) == 4 * branches
    errs = skip_errors(chi) + skip_errors(clo)
    assert len(errs) == 2 and max(errs) < 1e-5, errs

    # one profile name over both samplers: one 6-step sample per branch, E from both experts' true δ
    path = str(tmp_path / "wan22.profile.safetensors")
    chi, clo = observed_split(profile(hi, path), profile(lo, path), first, pos, neg, lat, cfg)
    prof = Profile.load(path)
    assert prof.n_steps == N and prof.count == branches
    assert torch.allclose(torch.from_numpy(prof.E), true_E(chi + clo), rtol=1e-4, atol=1e-7)


def test_block_patches_never_reached_are_reported(unet_dir, caplog):
    """A loop that stops asking for the dit patches (a changed ComfyUI, a custom forward) must not pass as a
    silent no-op: the run's log says nothing was cached."""
    model, pos, neg, lat = build("flux", unet_dir)
    patched = apply(model, MASK)
    patched.model_options["transformer_options"]["patches_replace"].pop("dit")
    with caplog.at_level("WARNING", logger="gcache"):
        ksample(patched, pos, neg, lat, 1.0)
    assert "never reached" in caplog.text and "nothing was cached" in caplog.text


# ------------------------------------------------------------------------------ forecasting (order 1 and 2)
def _times(model):
    """The model's normalized time of each of the N steps (t = timestep(σ) / timestep(σ_max); σ for flow models)."""
    import comfy.samplers
    ms = model.get_model_object("model_sampling")
    sig = comfy.samplers.calculate_sigmas(ms, "simple", N)[:-1]
    top = float(ms.timestep(ms.sigma_max.reshape(1).float()))
    return [float(ms.timestep(s.reshape(1).float())) / top for s in sig]


@pytest.mark.parametrize("name", ["flux", "wan21", "hunyuan_video"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_forecast_in_comfyui_classes(name, cfg, unet_dir):
    model, pos, neg, lat = build(name, unet_dir)
    plain = ksample(model, pos, neg, lat, cfg)
    for order in (1, 2):
        ones = hooks.patch_model(model, apply_mode.apply_config(model, Policy([1] * N, forecast=order)))
        assert torch.equal(plain, ksample(ones, pos, neg, lat, cfg))
    obs = StackObserver(hooks.patch_model(model, apply_mode.apply_config(model, Policy(MASK, forecast=1))),
                        FAMILIES[name][1])
    try:
        ksample(obs.model, pos, neg, lat, cfg)
    finally:
        obs.close()
    t, computed, errs = _times(model), [], []
    for j, c in enumerate(obs.calls):  # euler, one call per step: call j is step j
        if c["ran"]:
            computed.append((j, c["z"] - c["h"]))
            continue
        if len(computed) == 1:
            want = c["h"] + computed[-1][1]
        else:
            (p, dp), (i, di) = computed[-2:]
            want = c["h"] + di + (t[j] - t[i]) / (t[i] - t[p]) * (di - dp)
        errs.append(rel(c["z"], want))
    assert len(errs) == 3 and max(errs) < 1e-5, errs
