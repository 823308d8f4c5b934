"""What changed in ComfyUI between 0.3.64 and 0.33 that touches a cache node (../shared/comfyui/README.md), each
checked in-process on whichever tree COMFYUI_PATH points to (a change that does not exist in that tree is skipped
with its reason).

- fe053ba5: `model_options` is no longer deep-copied on clone, so GCache's config in transformer_options is shared
  by every clone of the patched model: two Apply nodes on one model, a patch node (a LoRA) after Apply.
- 0a2dd86e: the MultiGPU CFG split runs conds in MultiGPUThreadPool threads, where a context variable set by the
  sampling thread is not visible (GCache would silently compute every step); each device keeps its own cache.
- c38e7d65: transformer_options carries block_index / total_blocks / block_type: the adapters' first/last blocks
  agree with ComfyUI's own count.
"""
import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import comfy.lora  # noqa: E402
import comfy.sd  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402
from comfy.patcher_extension import WrappersMP  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.patching import hooks  # noqa: E402
from gcache.nodes.patching.adapters import block_slots  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def flux():
    return tm.flux()


def ksample(model, pos, neg, lat, cfg=1.0, seed=0):
    return comfy_nodes.common_ksampler(model, seed, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


def apply(model, mask):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask))))


class FirstBlockRuns:
    """Counts the runs of the first double block's MLP (it runs only when the stack computes)."""

    def __init__(self, model):
        mod = model.get_model_object("diffusion_model").double_blocks[0].img_mlp
        self.n = 0
        self.h = mod.register_forward_pre_hook(lambda m, a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *e):
        self.h.remove()


# ------------------------------------------------------------------------------ shared model_options (fe053ba5)
def test_two_apply_nodes_on_one_model_keep_their_own_policies(flux):
    m, pos, neg, lat = flux
    a, b = apply(m, [1, 0, 0, 0, 0, 0]), apply(m, [1, 1, 1, 0, 0, 1])
    chained = apply(a, [1, 0, 1, 0, 1, 0])  # a second Apply after the first replaces its policy, not a's
    for model, k in ((a, 1), (b, 4), (chained, 3), (a, 1), (m, N)):
        with FirstBlockRuns(m) as c:
            ksample(model, pos, neg, lat)
        assert c.n == k
    assert hooks.config_of(a).policy.n_computed == 1 and hooks.config_of(chained).policy.n_computed == 3


def _tiny_lora(model, rank=2, seed=3):
    """A LoRA on two of the tiny Flux's layers, as LoraLoaderModelOnly would load it from a file."""
    g = torch.Generator().manual_seed(seed)
    dm = model.get_model_object("diffusion_model")
    sd = {}
    for name in ("double_blocks.0.img_mlp.0", "single_blocks.0.linear1"):
        w = dm.get_submodule(name).weight
        sd[f"diffusion_model.{name}.lora_up.weight"] = torch.randn(w.shape[0], rank, generator=g) * 0.5
        sd[f"diffusion_model.{name}.lora_down.weight"] = torch.randn(rank, w.shape[1], generator=g) * 0.5
    return sd


def test_a_lora_after_apply_keeps_the_cache_and_changes_the_image(flux):
    m, pos, neg, lat = flux
    mask = [1, 0, 1, 0, 1, 0]
    patched = apply(m, mask)
    lora_sd = _tiny_lora(m)
    with_lora, _ = comfy.sd.load_lora_for_models(patched, None, lora_sd, 1.0, 0.0)  # LoraLoaderModelOnly's call
    assert len(with_lora.patches) == 2
    with FirstBlockRuns(m) as c:
        out = ksample(with_lora, pos, neg, lat, cfg=3.0)
    assert c.n == sum(mask)  # the LoRA's clone keeps GCache's wrappers, patches and config
    assert not torch.equal(out, ksample(patched, pos, neg, lat, cfg=3.0))
    plain_lora, _ = comfy.sd.load_lora_for_models(m, None, lora_sd, 1.0, 0.0)
    ones = apply(plain_lora, [1] * N)
    assert torch.equal(ksample(ones, pos, neg, lat, cfg=3.0), ksample(plain_lora, pos, neg, lat, cfg=3.0))


def test_one_patched_model_sampled_twice_keeps_runs_apart(flux):
    """Two KSamplers on one GCache Apply output (one prompt): two runs, each with its own residuals."""
    m, pos, neg, lat = flux
    patched = apply(m, [1, 0, 1, 0, 1, 0])
    first = ksample(patched, pos, neg, lat, seed=1)
    with FirstBlockRuns(m) as c:
        second = ksample(patched, pos, neg, lat, seed=2)
    assert c.n == 3 and not torch.equal(first, second)
    assert torch.equal(first, ksample(patched, pos, neg, lat, seed=1))  # nothing of the second run leaked back


# ------------------------------------------------------------------------------ MultiGPU CFG split (0a2dd86e)
def _with_cfg_split_threads(model, devices):
    """`model` with what ComfyUI's MultiGPU CFG split sets up per sampling run (sampler_helpers.
    prepare_model_patcher_multigpu_clones + MultiGPUThreadPool), here with CPU "devices": the conds then run in
    the pool's threads through comfy.samplers._calc_cond_batch_multigpu, as on several GPUs."""
    multigpu = pytest.importorskip("comfy.multigpu", reason="ComfyUI before 0a2dd86e has no MultiGPU CFG split")
    m = model.clone()

    def split(executor, *args, **kwargs):
        guider = executor.class_obj
        guider.model_options["multigpu_clones"] = {d: guider.model_patcher for d in devices}
        guider.model_options["multigpu_thread_pool"] = multigpu.MultiGPUThreadPool(devices)
        try:
            return executor(*args, **kwargs)
        finally:
            guider.model_options.pop("multigpu_clones", None)
            pool = guider.model_options.pop("multigpu_thread_pool", None)
            if pool is not None:
                pool.shutdown()
    m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, "test_multigpu", split)
    return m


@pytest.mark.parametrize("n_devices", [1, 2])
def test_cfg_split_threads_find_the_run_and_keep_a_cache_per_device(flux, n_devices, caplog):
    m, pos, neg, lat = flux
    devices = [torch.device("cpu"), torch.device("cpu", 0)][:n_devices]  # two keys, one CPU
    mask = [1, 0, 1, 0, 0, 1]
    plain = ksample(_with_cfg_split_threads(m, devices), pos, neg, lat, cfg=3.0)
    # cond and uncond in one batch or one call each: the same result up to the batching of the matmuls
    assert torch.allclose(plain, ksample(m, pos, neg, lat, cfg=3.0), atol=1e-5)
    with caplog.at_level("INFO", logger="gcache"), FirstBlockRuns(m) as c:
        out = ksample(_with_cfg_split_threads(apply(m, mask), devices), pos, neg, lat, cfg=3.0)
    assert c.n == sum(mask) * n_devices  # K steps, cond and uncond on one device or one each
    assert "computed 3/6 steps, skipped 3" in caplog.text and torch.isfinite(out).all()
    assert torch.allclose(out, ksample(apply(m, mask), pos, neg, lat, cfg=3.0), atol=1e-5)  # as without the split
    ones = ksample(_with_cfg_split_threads(apply(m, [1] * N), devices), pos, neg, lat, cfg=3.0)
    assert torch.equal(ones, plain)


# ------------------------------------------------------------------------------ block info (c38e7d65)
def test_first_and_last_blocks_agree_with_comfyuis_block_count(flux):
    """Where the loop says block_index / total_blocks / block_type, GCache's first block is ComfyUI's first of its
    first stack and its last block ComfyUI's last of the last stack."""
    m, pos, neg, lat = flux
    patched = apply(m, [1] * N)
    slots = block_slots(hooks.config_of(patched).adapter, m.get_model_object("diffusion_model"))
    seen = {}
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    for slot in slots:
        inner = dit[(slot.stack.key, slot.index)]

        def spy(args, extra, inner=inner, slot=slot):
            to = args["transformer_options"]
            seen[(slot.stack.key, slot.index)] = (to.get("block_index"), to.get("total_blocks"), to.get("block_type"))
            return inner(args, extra)
        patched.set_model_patch_replace(spy, "dit", slot.stack.key, slot.index)
    ksample(patched, pos, neg, lat)
    first, last = seen[(slots[0].stack.key, slots[0].index)], seen[(slots[-1].stack.key, slots[-1].index)]
    if first[1] is None:
        pytest.skip("this ComfyUI does not put block_index/total_blocks in transformer_options (before c38e7d65)")
    assert first[0] == 0 and first[2] == "double"
    assert last[0] == last[1] - 1 and last[2] == "single"
    assert all(seen[(s.stack.key, s.index)][0] == s.index for s in slots)
