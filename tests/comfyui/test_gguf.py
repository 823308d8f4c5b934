"""GGUF models (city96's ComfyUI-GGUF, a test host kept outside the repository: ../shared/custom_nodes/ComfyUI-GGUF,
copied to a writable place): a tiny Wan written as GGUF (Q8_0, and Q4_K) and loaded through its UnetLoaderGGUF, then
GCache Apply (auto) and GCache Profile. Skipped, with the reason, where the host or the `gguf` package is missing; to
run it elsewhere: `pip install "gguf>=0.13.0"` in ComfyUI's Python and GCACHE_GGUF_PACK=/path/to/ComfyUI-GGUF."""
import importlib
import os
import shutil
import sys

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACK = os.environ.get("GCACHE_GGUF_PACK") or os.path.join(REPO, "..", "shared", "custom_nodes", "ComfyUI-GGUF")
if not os.path.isfile(os.path.join(PACK, "nodes.py")):
    pytest.skip(f"ComfyUI-GGUF is not at {PACK} (set GCACHE_GGUF_PACK to a checkout of city96/ComfyUI-GGUF)",
                allow_module_level=True)
pytest.importorskip("gguf", reason="the `gguf` package is not installed in this Python: pip install 'gguf>=0.13.0'")

import folder_paths  # noqa: E402
import gguf_files  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes import auto as auto_mode  # noqa: E402
from gcache.nodes.profile_node import GCacheProfile  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """ComfyUI-GGUF as ComfyUI imports a custom node pack, from a writable copy."""
    root = tmp_path_factory.mktemp("gguf_pack")
    shutil.copytree(PACK, root / "ComfyUI_GGUF")
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("ComfyUI_GGUF.nodes")
    finally:
        sys.path.remove(str(root))


@pytest.fixture(scope="module")
def unet_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_unets")
    keys = ("unet", "diffusion_models")  # "unet" is the legacy name of "diffusion_models"
    old = {k: folder_paths.folder_names_and_paths.get(k) for k in keys}
    for k in keys:
        folder_paths.folder_names_and_paths[k] = ([str(d)], {".gguf", ".safetensors"})
    folder_paths.filename_list_cache.clear()
    yield d
    for k, v in old.items():
        if v is None:
            folder_paths.folder_names_and_paths.pop(k, None)
        else:
            folder_paths.folder_names_and_paths[k] = v
    folder_paths.filename_list_cache.clear()


def ksample(model, pos, neg, lat, cfg=3.0):
    return comfy_nodes.common_ksampler(model, 0, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_a_gguf_model_gets_auto_and_profile_without_being_dequantized_to_hash(pack, unet_dir, gcache_dir, quant,
                                                                              monkeypatch, caplog):
    counts = gguf_files.write(str(unet_dir / f"wan_{quant}.gguf"), tm._wan_state_dict(0), "wan", quant)
    assert counts.get(quant, 0) > 0, counts
    folder_paths.filename_list_cache.clear()
    model = pack.UnetLoaderGGUF().load_unet(f"wan_{quant}.gguf")[0]
    _, pos, neg, lat = tm.wan(str(unet_dir))
    dm = model.get_model_object("diffusion_model")
    quantized = [n for n, p in dm.named_parameters() if getattr(p, "tensor_type", None) is not None
                 and getattr(p.tensor_type, "name", "") == quant]
    assert quantized, "the loader kept no quantized weights"
    plain = ksample(model, pos, neg, lat)

    # auto's weights key reads a few raw values: it must not dequantize the model (nor fail on packed tensors)
    import ComfyUI_GGUF.dequant as dq
    calls = []
    real = dq.dequantize_tensor
    monkeypatch.setattr(dq, "dequantize_tensor", lambda *a, **k: calls.append(1) or real(*a, **k))
    key = auto_mode.model_key(model)
    assert calls == [] and key == auto_mode.model_key(model)
    monkeypatch.setattr(dq, "dequantize_tensor", real)

    auto = GCacheApply.execute(model, "(auto)", "model device", "remap", 2.0).result[0]
    with caplog.at_level("INFO", logger="gcache"):
        first = ksample(auto, pos, neg, lat)
    assert torch.equal(first, plain) and "computes every step and profiles it" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        second = ksample(auto, pos, neg, lat)
    assert "applying auto_WanModel-" + key in caplog.text and "skipped" in caplog.text
    assert torch.isfinite(second).all() and not torch.equal(second, plain)

    prof_model = GCacheProfile.execute(model, f"gguf_{quant}", "model device", True).result[0]
    assert torch.equal(ksample(prof_model, pos, neg, lat), plain)
    prof = Profile.load(str(gcache_dir / f"gguf_{quant}.profile.safetensors"))
    assert prof.count == 2 and prof.has_fit_stats() and prof.E[0, 1] > 0
