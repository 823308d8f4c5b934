"""bench/recorder.py loads core/profile.py as it was at a git revision: at HEAD that module records exactly what
this tree's recorder records (a clean tree; the loader, not the recorder, is what is checked here)."""
from __future__ import annotations

import subprocess

import pytest
import torch

from gcache.bench import recorder as bench
from gcache.core import profile as current


def test_profile_at_head_records_what_this_tree_records():
    head = subprocess.run(["git", "-C", bench.REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(["git", "-C", bench.REPO, "diff", "--quiet", "HEAD", "--", "core/profile.py"])
    if head.returncode != 0 or changed.returncode != 0:
        pytest.skip("needs a git checkout whose core/profile.py equals HEAD's")
    old = bench.profile_module_at(head.stdout.strip())
    assert old is not current and old.__package__ == current.__package__
    g = torch.Generator().manual_seed(0)
    hs = [torch.randn(2, 64, generator=g) for _ in range(5)]
    ds = [torch.randn(2, 64, generator=g) for _ in range(5)]
    profiles = []
    for mod in (old, current):
        rec = mod.ProfileRecorder([1.0 - k / 5 for k in range(5)], forecast=True)
        for j in range(5):
            rec.record(j, "all", hs[j], ds[j])
        profiles.append(rec.finish())
    assert (profiles[0].E == profiles[1].E).all() and profiles[0].E.shape == (5, 5)


def test_loading_a_revision_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """profile_module_at writes the old source to a temporary folder only while it loads it (every bench and test
    run once left a gcache-recorder-* folder behind)."""
    head = subprocess.run(["git", "-C", bench.REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("needs a git checkout")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    mod = bench.profile_module_at(head.stdout.strip())
    assert hasattr(mod, "ProfileRecorder") and list(tmp_path.iterdir()) == []
