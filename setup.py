"""Build configuration beside pyproject.toml (which holds the metadata): which packages and modules the wheel holds.

The repository root *is* the package `gcache` (pyproject's package-dir maps the name to "."), so each folder of it
that holds an __init__.py is the subpackage gcache.<folder>. setuptools' own discovery names packages by their path
and cannot add that prefix, and a list kept by hand left gcache.core.forecasters out of the wheel: the list is found
here instead. tests/ is not part of the package, nor is this file, though it lies in the package's folder
(tests/test_wheel.py builds the wheel and checks all three).
"""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
SUBPACKAGES = find_packages(where=ROOT, exclude=["tests", "tests.*"])


class BuildPyWithoutSetup(build_py):
    """distutils leaves the setup script out of a package's modules only when it runs it as `python setup.py`;
    a PEP 517 build (pip) runs it under another name and would ship gcache/setup.py."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("gcache", "setup")]


setup(packages=["gcache"] + [f"gcache.{name}" for name in SUBPACKAGES], cmdclass={"build_py": BuildPyWithoutSetup})
