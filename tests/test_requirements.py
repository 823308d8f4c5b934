"""requirements.txt (what ComfyUI-Manager and comfy-cli install) is pyproject.toml's [project].dependencies."""
import os
import re

import pytest

try:
    import tomllib  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11+) or tomli")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _split(req: str) -> tuple[str, str]:
    """(project name lower-cased with - for runs of -_. as PEP 503 does, the rest without whitespace)."""
    req = "".join(req.split())
    m = re.match(r"[A-Za-z0-9._-]+", req)
    assert m, f"not a requirement: {req!r}"
    return re.sub(r"[-_.]+", "-", m.group(0)).lower(), req[m.end():]


def _norm(req: str) -> str:
    return "".join(_split(req))


def requirements_txt(path: str) -> list[str]:
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.split(" #", 1)[0].strip()  # pip's inline comments need a space before '#'
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"{path}: option line {line!r}: keep requirements.txt plain (Manager, comfy-cli)"
        out.append(line)
    return out


def pyproject_dependencies(path: str) -> list[str]:
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def test_requirements_txt_equals_pyproject_dependencies():
    txt = requirements_txt(os.path.join(REPO, "requirements.txt"))
    deps = pyproject_dependencies(os.path.join(REPO, "pyproject.toml"))
    assert len(txt) == len({_norm(r) for r in txt}), f"requirements.txt lists a package twice: {txt}"
    assert {_norm(r) for r in txt} == {_norm(r) for r in deps}, (
        f"requirements.txt {sorted(txt)} != pyproject.toml [project].dependencies {sorted(deps)}: change both")


def test_torch_is_left_to_comfyui():
    """ComfyUI brings its own torch build (CUDA/ROCm/CPU); a pack that asks for torch can make pip replace it."""
    names = {_split(r)[0] for r in requirements_txt(os.path.join(REPO, "requirements.txt"))}
    assert not names & {"torch", "torchvision", "torchaudio"}, names


def test_the_parser_reads_what_pip_reads(tmp_path):
    p = tmp_path / "requirements.txt"
    p.write_text("# comment\n\nnumpy  # inline comment\nscikit_learn >= 1.3\n  Pillow\n")
    assert requirements_txt(str(p)) == ["numpy", "scikit_learn >= 1.3", "Pillow"]
    assert {_norm(r) for r in requirements_txt(str(p))} == {"numpy", "scikit-learn>=1.3", "pillow"}
