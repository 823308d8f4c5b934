"""What users run beside a cache node, in ComfyUI's own classes: TorchCompileModel (inductor on the CPU), a LoRA
before GCache Apply (auto), and the core cache nodes (EasyCache, LazyCache). GGUF models: test_gguf.py."""
import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import comfy.sd  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.errors import GCacheError  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.patching import companions, hooks  # noqa: E402

N = 6
MASK = [1, 0, 1, 0, 0, 1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("companion_unets"))
    return {"flux": tm.flux(), "wan": tm.wan(d)}


def ksample(model, pos, neg, lat, cfg=3.0, seed=0):
    return comfy_nodes.common_ksampler(model, seed, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


def apply(model, mask, **kw):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask), **kw)), "GCache Apply")


FIRST = {"flux": "double_blocks.0.img_mlp", "wan": "blocks.0.ffn"}


class Runs:
    """Counts the first block's real runs (a module inside it: it runs only when the stack computes)."""

    def __init__(self, model, family):
        mod = model.get_model_object("diffusion_model").get_submodule(FIRST[family])
        self.n = 0
        self.h = mod.register_forward_pre_hook(lambda m, a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *e):
        self.h.remove()


# ------------------------------------------------------------------------------------------------ torch.compile
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_torch_compile_before_gcache_compiles_the_blocks_and_never_recompiles_per_step(built, family, caplog):
    import torch._dynamo
    from comfy_extras.nodes_torch_compile import TorchCompileModel
    from torch._dynamo.utils import counters
    m, pos, neg, lat = built[family]
    torch._dynamo.reset()
    counters.clear()
    compiled = TorchCompileModel.execute(m, "inductor").result[0]
    eager = ksample(m, pos, neg, lat)
    plain_c = ksample(compiled, pos, neg, lat)
    assert torch.allclose(plain_c, eager, atol=1e-4, rtol=1e-4)
    with caplog.at_level("INFO", logger="gcache"):
        ones = apply(compiled, [1] * N)
    assert "compiles the" in caplog.text and "blocks of the" in caplog.text
    assert torch.allclose(ksample(ones, pos, neg, lat), plain_c, atol=1e-4, rtol=1e-4)  # compile tolerance
    assert counters["stats"]["unique_graphs"] > 0  # the blocks really were compiled (by the plain and all-ones runs)
    fast = apply(compiled, MASK)
    counters.clear()
    graphs = []
    for seed in range(3):  # three runs of the K < N policy (compiled blocks run no Python hooks: GCache's count,
        caplog.clear()     # and below the same latent as eager GCache with this mask)
        with caplog.at_level("INFO", logger="gcache"):
            out = ksample(fast, pos, neg, lat, seed=seed)
        assert "computed 3/6 steps, skipped 3" in caplog.text and torch.isfinite(out).all()
        graphs.append(counters["stats"]["unique_graphs"])
    # the blocks compiled for the plain and all-ones runs serve the masked runs too: no graph per step, none later
    assert graphs == [0, 0, 0], (graphs, dict(counters["stats"]))
    eager_fast = ksample(apply(m, MASK), pos, neg, lat, seed=2)
    assert torch.allclose(out, eager_fast, atol=1e-4, rtol=1e-4)


def test_torch_compile_after_gcache_is_said(built, caplog):
    from comfy_extras.nodes_torch_compile import TorchCompileModel
    m, pos, neg, lat = built["flux"]
    # dynamo's "eager" backend: the same wrapper and a real dynamo trace, without inductor's code generation per
    # recompile (the inductor run of this test took 40 s of the CI budget for the same log line)
    compiled_after = TorchCompileModel.execute(apply(m, MASK), "eager").result[0]
    with caplog.at_level("WARNING", logger="gcache"):
        ksample(compiled_after, pos, neg, lat)
    assert "compiled (TorchCompileModel) after GCache" in caplog.text and "Put TorchCompileModel before" in caplog.text


def test_an_object_patched_family_refuses_torch_compile(tmp_path):
    from comfy_extras.nodes_torch_compile import TorchCompileModel
    m = tm.lumina2()[0]
    with pytest.raises(GCacheError, match="don't combine on lumina2"):
        apply(TorchCompileModel.execute(m, "inductor").result[0], MASK)


def test_a_downstream_compile_or_cache_node_is_refused_when_the_node_runs():
    prompt = {"1": {"class_type": "UNETLoader", "inputs": {}},
              "2": {"class_type": "GCacheApply", "inputs": {"model": ["1", 0]}},
              "3": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["2", 0]}},
              "4": {"class_type": "TorchCompileModel", "inputs": {"model": ["3", 0]}},
              "5": {"class_type": "KSampler", "inputs": {"model": ["4", 0]}}}
    with pytest.raises(GCacheError, match="Put TorchCompileModel before GCache Apply"):
        companions.check_prompt(prompt, "2", "GCache Apply")
    prompt["4"]["class_type"] = "EasyCache"
    with pytest.raises(GCacheError, match="EasyCache after GCache Apply"):
        companions.check_prompt(prompt, "2", "GCache Apply")
    prompt["4"]["class_type"] = "ModelSamplingFlux"
    companions.check_prompt(prompt, "2", "GCache Apply")  # anything else is fine


# ------------------------------------------------------------------------------------------------ EasyCache
@pytest.mark.parametrize("node", ["EasyCache", "LazyCache"])
def test_core_cache_nodes_and_gcache_refuse_to_share_a_model(built, node):
    import comfy_extras.nodes_easycache as ec
    m, pos, neg, lat = built["flux"]
    cache_node = getattr(ec, node + "Node")
    with_cache = cache_node.execute(m, 0.2, 0.15, 0.95, False).result[0]
    with pytest.raises(GCacheError, match="EasyCache or LazyCache"):
        apply(with_cache, MASK)  # before GCache Apply: refused when GCache Apply runs
    after = cache_node.execute(apply(m, MASK), 0.2, 0.15, 0.95, False).result[0]
    with pytest.raises(GCacheError, match="after GCache"):
        ksample(after, pos, neg, lat)  # after it (an API client): refused before any step


# ------------------------------------------------------------------------------------------------ LoRA
def _lora(model, seed, rank=2):
    g = torch.Generator().manual_seed(seed)
    dm = model.get_model_object("diffusion_model")
    sd = {}
    for name in ("double_blocks.0.img_mlp.0", "single_blocks.0.linear1"):
        w = dm.get_submodule(name).weight
        sd[f"diffusion_model.{name}.lora_up.weight"] = torch.randn(w.shape[0], rank, generator=g) * 0.5
        sd[f"diffusion_model.{name}.lora_down.weight"] = torch.randn(rank, w.shape[1], generator=g) * 0.5
    return sd


def test_a_lora_before_apply_auto_gets_its_own_policy(built, gcache_dir, caplog):
    """Auto's files are named by the weights the model samples with, LoRAs included: another LoRA or strength is
    another model (its own profile and policy); the same LoRA at the same strength again finds its policy."""
    import os
    m, pos, neg, lat = built["flux"]
    counts = []
    for seed, strength, profiles in ((1, 1.0, True), (1, 0.5, True), (2, 1.0, True), (1, 1.0, False)):
        lora_model, _ = comfy.sd.load_lora_for_models(m, None, _lora(m, seed), strength, 0.0)  # LoraLoaderModelOnly
        caplog.clear()
        with caplog.at_level("INFO", logger="gcache"):
            ksample(GCacheApply.execute(lora_model, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
        assert ("computes every step and profiles it" in caplog.text) == profiles, caplog.text
        assert profiles or "applying auto_Flux-" in caplog.text
        counts.append(len([f for f in os.listdir(gcache_dir) if f.endswith("_2x.json")]))
    assert counts == [1, 2, 3, 3]
