"""search/infra/requirements.py: a missing optional package is a GCacheError that names it and the install command."""
import os
import sys

import pytest

from gcache.core.errors import GCacheError
from gcache.search.infra import requirements as req

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_present_modules_pass():
    assert req.require("json", "numpy") is None


def test_missing_packages_are_named_with_their_pip_names_and_the_command(monkeypatch):
    for mod in ("sklearn", "skimage", "lpips"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import mod` now raises ModuleNotFoundError(name=mod)
    with pytest.raises(GCacheError) as e:
        req.require(*req.search_modules("lpips_ssim"))
    msg = str(e.value)
    assert msg.startswith("GCache Search needs scikit-learn, scikit-image and lpips, which are not installed in the "
                          f"Python that runs ComfyUI ({sys.executable}). Install GCache's requirements with:\n")
    assert f"{sys.executable} -m pip install -r {os.path.join(REPO, 'requirements.txt')}" in msg
    assert "Traceback" not in msg and "ModuleNotFoundError" not in msg and "restart ComfyUI" in msg
    assert e.value.__cause__ is None or isinstance(e.value.__cause__, ImportError)


def test_one_missing_package_is_named_alone(monkeypatch):
    monkeypatch.setitem(sys.modules, "lpips", None)
    with pytest.raises(GCacheError, match=r"^GCache Search needs lpips, which is not installed in the Python"):
        req.require("numpy", "lpips")


def test_an_installed_package_that_cannot_be_imported_says_why(tmp_path, monkeypatch):
    (tmp_path / "gcache_broken_pkg").mkdir()
    (tmp_path / "gcache_broken_pkg" / "__init__.py").write_text("import gcache_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GCacheError) as e:
        req.require("gcache_broken_pkg", what="This test")
    msg = str(e.value)
    assert msg.startswith("This test needs gcache_broken_pkg, which is installed but does not import "
                          "(`import gcache_broken_pkg`: No module named 'gcache_dependency_that_is_not_there'). "
                          "Install GCache's requirements with:")


def test_search_modules_per_objective_and_every_pip_name_is_in_requirements_txt():
    assert req.search_modules("psnr") == ("sklearn",)
    assert req.search_modules("ssim") == ("sklearn", "skimage")
    assert req.search_modules("lpips_ssim") == ("sklearn", "skimage", "lpips")
    assert req.REQUIREMENTS == os.path.join(REPO, "requirements.txt") and os.path.isfile(req.REQUIREMENTS)
    listed = {line.split("#")[0].strip().lower() for line in open(req.REQUIREMENTS)} - {""}
    assert {req.PIP_NAMES[m] for m in req.search_modules("lpips_ssim")} <= listed
    assert set(req.PIP_NAMES.values()) <= listed, "PIP_NAMES names a package requirements.txt does not install"


def test_missing_and_broken_together_are_both_named(tmp_path, monkeypatch):
    (tmp_path / "gcache_broken_pkg2").mkdir()
    (tmp_path / "gcache_broken_pkg2" / "__init__.py").write_text("raise ImportError('DLL load failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(GCacheError) as e:
        req.require("skimage", "gcache_broken_pkg2")
    msg = str(e.value)
    assert "needs scikit-image, which is not installed" in msg
    assert "needs gcache_broken_pkg2, which is installed but does not import (`import gcache_broken_pkg2`: DLL load " \
        "failed)" in msg
    assert msg.count("pip install -r") == 1
