"""Family classes this ComfyUI lacks (headless: a fake import_module stands for ComfyUI's model modules). The real
check, with a model module hidden in real ComfyUI, is tests/comfyui/test_family_paths.py."""
import types

import pytest
import torch

from gcache.nodes.patching import adapters, family_paths
from gcache.nodes.patching.adapters import ADAPTERS, FALLBACK, choose_adapter


@pytest.fixture(autouse=True)
def no_gone():
    adapters.set_gone({})
    yield
    adapters.set_gone({})


def importer(missing=(), broken=(), empty=()):
    """import_module for the table's modules: `missing` raise ImportError, `broken` a RuntimeError while importing,
    `empty` import without the classes; every other module has every class the table names in it."""
    names = {}
    for ad in ADAPTERS:
        for path in ad.classes:
            module, _, cls = path.rpartition(".")
            names.setdefault(module, set()).add(cls)

    def import_module(module):
        if module in missing:
            raise ModuleNotFoundError(module)
        if module in broken:
            raise RuntimeError("a model module that fails on import")
        return types.SimpleNamespace(**{c: type(c, (), {}) for c in names[module] if module not in empty})
    return import_module


def test_every_class_found_leaves_nothing_out(caplog):
    with caplog.at_level("INFO", logger="gcache"):
        assert family_paths.check(importer()) == []
    assert adapters.GONE == {} and "left out" not in caplog.text


def test_a_missing_or_broken_module_leaves_its_families_out_in_one_line(caplog):
    with caplog.at_level("INFO", logger="gcache"):
        out = family_paths.check(importer(missing={"comfy.ldm.lumina.model"}, empty={"comfy.ldm.krea2.model"},
                                          broken={"comfy.ldm.genmo.joint_model.asymm_models_joint"}))
    assert out == ["mochi", "lumina2", "krea2"]
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1 and "mochi, lumina2, krea2" in lines[0]
    assert "comfy.ldm.lumina.model.NextDiT" in adapters.GONE and "krea2.model has no class" in \
        adapters.GONE["comfy.ldm.krea2.model.SingleStreamDiT"]


def test_a_family_with_one_of_its_classes_left_is_kept():
    assert family_paths.check(importer(missing={"comfy.ldm.wan.model_animate"})) == []
    assert set(adapters.GONE) == {"comfy.ldm.wan.model_animate.AnimateWanModel"}


class Flux(torch.nn.Module):
    __module__ = "comfy.ldm.flux.model"

    def __init__(self):
        super().__init__()
        self.double_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.single_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))


class Chroma(Flux):
    __module__ = "comfy.ldm.chroma.model"


def test_a_model_of_a_family_left_out_falls_back_loudly(caplog):
    assert choose_adapter(Flux()).name == "flux"
    family_paths.check(importer(missing={"comfy.ldm.flux.model"}))
    with caplog.at_level("WARNING", logger="gcache"):
        assert choose_adapter(Flux()) is FALLBACK
    assert "belongs to the flux family" in caplog.text and "could not be found on this ComfyUI" in caplog.text
    assert choose_adapter(Chroma()).name == "chroma"  # its own row is there


def test_a_moved_class_is_recognised_by_its_name(caplog):
    family_paths.check(importer(missing={"comfy.ldm.flux.model"}))

    class Moved(torch.nn.Module):  # the class moved to another module: its MRO has no table path at all
        __module__ = "comfy.ldm.flux_next.model"
    Moved.__qualname__ = "Flux"
    with caplog.at_level("WARNING", logger="gcache"):
        assert choose_adapter(Moved()) is FALLBACK
    assert "belongs to the flux family" in caplog.text and "moved or was renamed" in caplog.text


def test_the_check_never_raises():
    def import_module(module):
        raise SystemError("anything")
    left = family_paths.check(import_module)
    assert set(left) == {ad.name for ad in ADAPTERS}
