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
        assert not line.startswith("-"), \
            f"{path}: option line {line!r}: keep requirements.txt plain (Manager, comfy-cli)"
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


def test_every_install_hint_names_a_venvs_pip_and_our_distribution():
    """A hint that says `pip install` names the pip of a given Python (`"<python>" -m pip install`, `.venv/bin/pip`),
    never a bare pip that could install into another environment; none names the distribution `gcache`, which on the
    package index is another project; and the Ray pin it names is pyproject's cluster extra."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["name"] == "comfyui-gcache"
    ray_pin = next(r for r in project["optional-dependencies"]["cluster"] if r.startswith("ray"))
    bad = []
    for folder in ("core", "search", "nodes", "bench", "reference_model", "web"):
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            for name in names:
                if not name.endswith((".py", ".js", ".sh")):
                    continue
                path = os.path.join(root, name)
                text = open(path, encoding="utf-8").read()
                rel = os.path.relpath(path, REPO)
                for m in re.finditer(r"pip install\b", text):
                    before = text[max(0, m.start() - 12):m.start()]
                    if not re.search(r"(-m |bin/)$", before):
                        bad.append(f"{rel}: bare `pip install` ({text[m.start() - 30:m.end() + 20]!r})")
                bad += [f"{rel}: names the distribution gcache[...]" for _ in re.finditer(r"['\"]gcache\[", text)]
                bad += [f"{rel}: {pin} is not pyproject's {ray_pin}" for pin in re.findall(r"ray==[\d.]+", text)
                        if pin != ray_pin]
    assert not bad, "\n".join(bad)


def test_the_version_is_one_value():
    """pyproject.toml's version is the package's (core/version.py; the root's __version__ and the self-check's
    verdicts read it there)."""
    import gcache
    from gcache.core.version import VERSION
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["version"] == VERSION == gcache.__version__
