"""GCache's version: the package root re-exports it as `__version__`, and the self-check's verdicts record it (a
GCache update checks every model again). pyproject.toml's [project].version is the same (tests/test_requirements.py)."""

VERSION = "0.1.0"
