"""The optional packages of the search, checked before it starts, with a message that says how to install them.

ComfyUI-Manager and comfy-cli install a pack's requirements.txt into ComfyUI's Python; an install that skipped it
(a plain `git clone`, a failed pip run) still loads the nodes, because scikit-learn, scikit-image and lpips are
imported lazily. `require` turns the ImportError a search would hit minutes later (after its reference runs)
into a GCacheError, at once, that names the missing packages and the command that installs them.
"""
from __future__ import annotations

import importlib
import os
import sys

from ...core.errors import GCacheError

# import name -> the name pip installs it under (requirements.txt)
PIP_NAMES = {"sklearn": "scikit-learn", "skimage": "scikit-image", "lpips": "lpips", "scipy": "scipy",
             "numpy": "numpy", "safetensors": "safetensors", "PIL": "pillow"}

PACK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # search/infra/ -> the pack
REQUIREMENTS = os.path.join(PACK_DIR, "requirements.txt")


def search_modules(objective: str) -> tuple[str, ...]:
    """What a search with this objective imports beyond ComfyUI's own requirements: the GP (scikit-learn) always;
    SSIM (scikit-image) for 'ssim' and 'lpips_ssim'; lpips for 'lpips_ssim'."""
    mods = ["sklearn"]
    if objective in ("ssim", "lpips_ssim"):
        mods.append("skimage")
    if objective == "lpips_ssim":
        mods.append("lpips")
    return tuple(mods)


def install_command() -> str:
    """The command that installs GCache's requirements into the Python that runs this code (ComfyUI's)."""
    py = sys.executable or "python"
    q = (lambda s: f'"{s}"' if " " in s else s)
    return f"{q(py)} -m pip install -r {q(REQUIREMENTS)}"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def require(*modules: str, what: str = "GCache Search", in_comfyui: bool = True) -> None:
    """Import each module; if any fails, raise one GCacheError naming every package that failed and the command
    that installs them. Returns None when all import (they are then in sys.modules: later imports are free).
    in_comfyui=False (the command-line tools): the message speaks of this Python, not ComfyUI's, and its one line
    installs the packages by name (an installed wheel has no requirements.txt)."""
    missing, broken = [], []  # pip names not installed; (pip name, module, why) installed but failing
    if not all(m in sys.modules for m in modules):
        importlib.invalidate_caches()  # a package pip-installed while ComfyUI runs is then found
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError as e:  # ModuleNotFoundError included
            top = mod.split(".")[0]
            pip_name = PIP_NAMES.get(top, top)
            if (getattr(e, "name", None) or "").split(".")[0] == top:
                missing.append(pip_name)
            else:  # installed, but it cannot be imported: a dependency of it is missing or broken
                broken.append((pip_name, mod, (str(e).splitlines() or [type(e).__name__])[0]))
    if not missing and not broken:
        return
    if not in_comfyui:
        names = missing + [pip_name for pip_name, _, _ in broken]
        problems = ([f"{_and(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this Python "
                     f"({sys.executable})"] if missing else []) + \
            [f"{pip_name} is installed but does not import (`import {mod}`: {why})" for pip_name, mod, why in broken]
        q = (lambda s: f'"{s}"' if " " in s else s)
        raise GCacheError(f"{what} needs {_and(names)}: {'; '.join(problems)}. Install "
                          f"{'it' if len(names) == 1 else 'them'} with: {q(sys.executable or 'python')} -m pip "
                          f"install {' '.join(names)}")
    lines = []
    if missing:
        lines.append(f"{what} needs {_and(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed in "
                     f"the Python that runs ComfyUI ({sys.executable}).")
    for pip_name, mod, why in broken:
        lines.append(f"{what} needs {pip_name}, which is installed but does not import (`import {mod}`: {why}).")
    raise GCacheError(
        " ".join(lines) + f" Install GCache's requirements with:\n    {install_command()}\nthen restart ComfyUI. "
        "(ComfyUI-Manager and `comfy node install` do this when they install GCache; a plain `git clone` does not.)")
