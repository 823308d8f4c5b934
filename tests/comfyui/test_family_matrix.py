"""Every family in ComfyUI's own model classes (tiny random weights), at cfg 1 and cfg > 1.

For each family: the adapter chosen; all-ones bit-identical to the unpatched model; a K < N policy runs the block stack
exactly K times per branch; on every skipped step the stack's output equals h + the true δ of the last computed step;
Profile's E equals the E built from the true δ, and its run's self-check of the skip path passed, with the error it
measured, far below the tolerance (the whole-model fallback: "not checked", its reason). The true δ is observed from
outside GCache: a copy of the stack input made before GCache's first block patch sees it (the check that catches blocks
that add into their input in place, LTXV and Chroma), and the image tokens of the last block's output.
"""
import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_image_models as tim  # noqa: E402
import tiny_models as tm  # noqa: E402
import tiny_video_models as tvm  # noqa: E402
import torch  # noqa: E402
from comfy.patcher_extension import WrappersMP  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.modes import profile as profile_mode
from gcache.nodes.patching import hooks  # noqa: E402
from gcache.nodes.patching.adapters import Route, block_slots  # noqa: E402
from gcache.nodes.patching.streams import Layout  # noqa: E402

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

# The DiT families that are new in ComfyUI 0.33 and the route each is verified with (or the whole-model fallback, with
# the reason nodes/patching/adapters.NOT_BY_BLOCKS gives); the builders are in tiny_*_models_033.py.
FALLBACK = "whole-model fallback"
FAMILIES_033 = {
    "flux2": "flux", "flux2_klein": "flux", "longcat_image": "flux", "z_image": "lumina2", "z_image_pixel": "lumina2",
    "qwen_image_edit_2509": "qwen_image", "qwen_image_edit_2511": "qwen_image", "qwen_image_layered": "qwen_image",
    "ernie_image": "ernie_image", "hidream_o1": FALLBACK, "krea2": "krea2", "anima": "cosmos_predict2",
    "hunyuan_image21": "hunyuan_video", "kandinsky5_image": "kandinsky5", "omnigen2": "omnigen2", "boogu": FALLBACK,
    "lens": "lens", "mage_flow": "mage_flow", "joyimage": "joyimage", "ideogram4": "ideogram4", "pixeldit": FALLBACK,
    "pid": FALLBACK, "hunyuan_dit": "hunyuan_dit",
    "ltx2": "ltx2", "hunyuan_video15": "hunyuan_video", "wan_animate": "wan", "wan_animate2": "wan", "wan_s2v": "wan",
    "wan_humo": "wan", "wan_camera": "wan", "wan_scail": "wan", "wan_scail2": "wan", "wan_dancer": "wan",
    "wan_flowrvs": "wan", "wan_causal": FALLBACK, "kandinsky5": "kandinsky5", "cogvideox": "cogvideox",
    "minimax_h3": "minimax_h3", "mochi": "mochi", "seedvr2": FALLBACK,
}


def _version() -> tuple:
    import comfyui_version
    return tuple(int(p) for p in comfyui_version.__version__.split(".")[:3])


NEW_IN_033 = _version() < (0, 33, 0)  # these families need ComfyUI 0.33: skipped (with that reason) before it
if not NEW_IN_033:
    import tiny_image_models_033 as tim33  # noqa: E402
    import tiny_video_models_033 as tvm33  # noqa: E402
    for _mod in (tim33, tvm33):
        for _name, _build in _mod.BUILDERS.items():
            FAMILIES[_name] = (_build, _mod.FIRST_BLOCK[_name], FAMILIES_033[_name])
else:
    for _name in FAMILIES_033:
        FAMILIES[_name] = (None, None, FAMILIES_033[_name])
_BUILT: dict = {}


@pytest.fixture(scope="module")
def unet_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("matrix_unets"))


def build(name, unet_dir):
    if FAMILIES[name][0] is None:
        pytest.skip(f"{name} is a family of ComfyUI 0.33; this tree is {'.'.join(map(str, _version()))}")
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
        # object route: the block's own modules (not the block: an object-patched block is called on skips too);
        # dit route: the first block's original_block (see _dit); fallback: the diffusion model
        watched = list(dm.get_submodule(first_block).modules())[1:] if ad.route == Route.OBJECT else \
            [dm] if ad.route == Route.FALLBACK else []
        self.hooks = [m.register_forward_pre_hook(self._ran) for m in watched]
        # outermost APPLY_MODEL wrapper: marks calls, and is the stack itself for the whole-model fallback
        w = self.model.wrappers
        w[WrappersMP.APPLY_MODEL] = {"observer": [self._apply_model], **w.get(WrappersMP.APPLY_MODEL, {})}
        for slot in block_slots(ad, dm):
            if ad.route == Route.DIT:
                fn = self.model.model_options["transformer_options"]["patches_replace"]["dit"][(slot.stack.key,
                                                                                               slot.index)]
                self.model.set_model_patch_replace(gcaches(self._dit(fn, slot), fn), "dit", slot.stack.key, slot.index)
            else:
                name = f"diffusion_model.{slot.stack.attr}.{slot.child}.forward"
                fn = self.model.object_patches[name]
                self.model.add_object_patch(name, gcaches(self._object(fn, slot), fn))

    def _ran(self, module, args):
        if self.cur:
            self.cur["ran"] = True

    def _apply_model(self, executor, *args, **kwargs):
        topts = args[5] if len(args) > 5 else kwargs.get("transformer_options", {})
        x = args[0]
        self.cur = {"cou": tuple(topts.get("cond_or_uncond") or ()), "batch": batch_of(x), "ran": False,
                    "h": None, "z": None, "sigma": float(args[1].reshape(-1)[0])}
        if self.adapter.route == Route.FALLBACK:
            self.cur["h"] = flat(x).clone()
        out = executor(*args, **kwargs)
        if self.adapter.route == Route.FALLBACK:
            self.cur["z"] = flat(out).clone()
        self.calls.append(self.cur)
        self.cur = {}
        return out

    def _enter(self, stream, layout=Layout.IMG, img_slice=None):
        """The stack's input, cut where ComfyUI says the image tokens are when the first block's stream is joint."""
        if self.cur.get("h") is None:
            joint = not isinstance(stream, (tuple, list)) and layout in (Layout.TXT_FIRST, Layout.IMG_FIRST)
            h = stream[:, img_slice[0]:img_slice[1]] if joint and img_slice is not None else packed(stream)
            self.cur["h"] = h.clone()

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
        lift = (lambda t: t) if slot.stack.batched else (lambda t: t[None])  # MiniMax H3: [tokens, dim]

        def observed(args, extra):
            self._enter(lift(args["img"]))
            if slot.first:  # the first block's original really ran (some loops call blocks as methods: no hooks)
                original = extra["original_block"]
                extra = dict(extra, original_block=lambda a: self._ran(None, None) or original(a))
            out = fn(args, extra)
            self._leave(lift(out["img"]), slot.stack.layout, (args.get("transformer_options") or {}).get("img_slice"))
            return out
        return observed

    def _object(self, fn, slot):
        arg, bd = slot.stack.call.arg, slot.stack.call.batch_dim

        def engine(t):
            return t.movedim(bd, 0) if bd else t

        def observed(*a, **kw):
            self._enter(engine(kw[arg] if isinstance(arg, str) else a[arg]), slot.stack.layout,
                        (kw.get("transformer_options") or {}).get("img_slice"))
            out = fn(*a, **kw)
            self._leave(engine(out[0] if isinstance(out, tuple) else out), slot.stack.layout,
                        (kw.get("transformer_options") or {}).get("img_slice"))
            return out
        return observed

    def close(self):
        for h in self.hooks:
            h.remove()


def gcaches(spy, fn):
    """The observer's spy carries the marker of the GCache patch it wraps, so that GCache takes it for its own patch
    and the spy stays outside GCache's gate (another node's patch after GCache gets GCache's gate around it,
    nodes/patching/foreign.py: the spy would then miss the skipped steps)."""
    for attr in ("gcache_slot", "gcache_owner", "gcache_inner"):
        setattr(spy, attr, getattr(fn, attr))
    return spy


def flat(x):
    """A model input/output as one tensor: ComfyUI 0.33's NestedTensor (LTX-2's video + audio latents) side by side."""
    if hasattr(x, "tensors"):
        return torch.cat([t.reshape(t.shape[0], -1) for t in x.tensors], 1)
    return x


def batch_of(x):
    return (x.tensors[0] if hasattr(x, "tensors") else x).shape[0]


def same(a, b) -> bool:
    return torch.equal(flat(a), flat(b))


def by_step(calls) -> list:
    """The calls grouped by sampler step (euler: one sigma per step; a model that runs its conds in separate calls
    makes several calls per step)."""
    steps: dict = {}
    for c in calls:
        steps.setdefault(c["sigma"], []).append(c)
    return [steps[s] for s in sorted(steps, reverse=True)]


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
    """E[i, j] = mean over branches of mean |δ_i − δ_j| from the observed δ (each branch's calls in step order)."""
    per_branch: dict = {}
    for c in calls:
        d, cou = c["z"] - c["h"], c["cou"] or (0,)
        for b, part in zip(cou, d.chunk(len(cou), 0)):
            per_branch.setdefault(b, []).append(part.double())
    n = len(next(iter(per_branch.values())))
    E = torch.zeros(n, n, dtype=torch.float64)
    for parts in per_branch.values():
        for i in range(n):
            for j in range(n):
                E[i, j] += (parts[i] - parts[j]).abs().mean().item() / len(per_branch)
    return E


def apply(model, mask):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask))))


def profile(model, path):
    return hooks.patch_model(model, profile_mode.profile_config(model, path))


CASES = [(name, cfg) for name in FAMILIES for cfg in (1.0, 3.0)]


@pytest.mark.parametrize("name,cfg", CASES, ids=[f"{n}-cfg{c:g}" for n, c in CASES])
def test_family(name, cfg, unet_dir, tmp_path, caplog):
    model, pos, neg, lat = build(name, unet_dir)
    _, first_block, expected = FAMILIES[name]
    branches = 1 if cfg == 1.0 else 2

    # the adapter chosen, and the log says which route it took
    with caplog.at_level("INFO", logger="gcache"):
        ad = config_of(apply(model, MASK)).adapter
    assert ad.name == expected
    if expected == FALLBACK:
        assert "whole-model fallback" in caplog.text, caplog.text
        # a family GCache knows: the log gives the reason (nodes/patching/adapters.NOT_BY_BLOCKS)
        if name in FAMILIES_033:
            assert "cached as a whole model, not by blocks" in caplog.text, caplog.text

    # all ones: bit-identical to the unpatched model
    plain = ksample(model, pos, neg, lat, cfg)
    assert same(plain, ksample(apply(model, [1] * N), pos, neg, lat, cfg))

    # K < N: the stack runs K times per branch; each skipped step outputs h + the last computed true δ
    obs = StackObserver(apply(model, MASK), first_block)
    try:
        out = ksample(obs.model, pos, neg, lat, cfg)
    finally:
        obs.close()
    assert sum(c["batch"] for c in obs.calls if c["ran"]) == sum(MASK) * branches * batch_of(lat)
    steps = by_step(obs.calls)
    assert [[c["ran"] for c in calls] for calls in steps] == [[bool(v)] * len(calls) for v, calls in zip(MASK, steps)]
    errs = skip_errors(obs.calls)
    assert len(errs) == sum(len(calls) for v, calls in zip(MASK, steps) if not v) and max(errs) < 1e-5, \
        f"skip output vs h + true δ: {errs}"
    assert torch.isfinite(flat(out)).all() and not same(out, plain)

    # Profile: E equals the E built from the true δ
    path = str(tmp_path / f"{name}.profile.safetensors")
    obs = StackObserver(profile(model, path), first_block)
    try:
        assert same(ksample(obs.model, pos, neg, lat, cfg), plain)
    finally:
        obs.close()
    prof = Profile.load(path)
    assert prof.count == branches
    check = prof.meta["selfcheck"]  # run 1's self-check (tests/comfyui/test_selfcheck.py: margins, controls)
    assert len(check) == 1 and check[0]["family"] == expected and check[0]["comfyui"] == ".".join(map(str, _version()))
    if expected == FALLBACK:
        assert check[0]["result"] == "not checked" and "whole-model fallback" in check[0]["why"], check
    else:
        assert check[0]["result"] == "pass" and 3 * check[0]["error"] <= check[0]["tolerance"], check
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


@pytest.mark.parametrize("name", ["flux", "wan21", "hunyuan_video", "flux2", "z_image", "ltx2", "hunyuan_video15"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_forecast_in_comfyui_classes(name, cfg, unet_dir):
    """Linear and profile-fitted forecasts: all ones bit-identical; each skipped step = h + the forecast from the
    true δ of the computed steps (fitted: δ_i + α·(δ_i − δ_p) with the policy's α; linear in normalized time)."""
    model, pos, neg, lat = build(name, unet_dir)
    plain = ksample(model, pos, neg, lat, cfg)
    for fc in ("linear", "quadratic", "fitted"):
        ones = hooks.patch_model(model, apply_mode.apply_config(model, Policy([1] * N, forecast=fc)))
        assert same(plain, ksample(ones, pos, neg, lat, cfg))
    t = _times(model)
    alpha = {"4": [0, 3, 0.3]}  # MASK computes 0, 3, 5: step 4 forecasts from 0 and 3
    for fc, coef in (("linear", lambda p, i, j: (t[j] - t[i]) / (t[i] - t[p])), ("fitted", lambda p, i, j: 0.3)):
        pol = Policy(MASK, forecast=fc, forecast_params={"alpha": alpha} if fc == "fitted" else {})
        obs = StackObserver(hooks.patch_model(model, apply_mode.apply_config(model, pol)), FAMILIES[name][1])
        try:
            ksample(obs.model, pos, neg, lat, cfg)
        finally:
            obs.close()
        computed, errs = [], []
        for j, calls in enumerate(by_step(obs.calls)):
            c = calls[0] if len(calls) == 1 else None
            assert c is not None, "one call per step expected for the forecast check"
            if c["ran"]:
                computed.append((j, c["z"] - c["h"]))
                continue
            if len(computed) == 1:
                want = c["h"] + computed[-1][1]
            else:
                (p, dp), (i, di) = computed[-2:]
                want = c["h"] + di + coef(p, i, j) * (di - dp)
            errs.append(rel(c["z"], want))
        assert len(errs) == 3 and max(errs) < 1e-5, (fc, errs)


# ------------------------------------------------------------------------------ a subclass the table does not name
def test_a_subclass_not_in_the_table_is_checked_or_falls_back_loudly(unet_dir, caplog):
    """An unnamed subclass with the row class's own block loop gets the adapter (and passes the true-δ check); one
    that overrides the loop falls back to the whole model, saying why (never an adapter it was not verified on)."""
    from comfy.ldm.flux.model import Flux
    model, pos, neg, lat = build("flux", unet_dir)
    dm = model.get_model_object("diffusion_model")

    class SameLoop(Flux):  # e.g. a pack's subclass that adds a method
        pass

    class OwnLoop(Flux):  # e.g. a pack's subclass with a forward of its own
        def forward_orig(self, *a, **kw):
            return super().forward_orig(*a, **kw)

    original = type(dm)
    try:
        for cls, expected, said in ((SameLoop, "flux", "was not verified with the flux adapter"),
                                    (OwnLoop, FALLBACK, "overrides forward_orig")):
            dm.__class__ = cls
            caplog.clear()
            with caplog.at_level("INFO", logger="gcache"):
                patched = apply(model, MASK)
            assert config_of(patched).adapter.name == expected and said in caplog.text, caplog.text
            obs = StackObserver(patched, "double_blocks.0")
            try:
                ksample(obs.model, pos, neg, lat, 1.0)
            finally:
                obs.close()
            errs = skip_errors(obs.calls)
            assert len(errs) == N - sum(MASK) and max(errs) < 1e-5, errs
    finally:
        dm.__class__ = original
