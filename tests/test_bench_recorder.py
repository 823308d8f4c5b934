"""bench/recorder.py loads core/ as it was at a git revision, as a package of its own: at HEAD that package records
exactly what this tree's recorder records (a clean tree; the loader, not the recorder, is what is checked here)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from gcache.bench import recorder as bench
from gcache.core import recorder as current


def test_core_at_head_records_what_this_tree_records():
    head = subprocess.run(["git", "-C", bench.REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(["git", "-C", bench.REPO, "diff", "--quiet", "HEAD", "--", "core"])
    untracked = subprocess.run(["git", "-C", bench.REPO, "ls-files", "--others", "--exclude-standard", "core"],
                               capture_output=True, text=True)
    if head.returncode != 0 or changed.returncode != 0 or untracked.stdout.strip():
        pytest.skip("needs a git checkout whose core/ equals HEAD's")
    old = bench.recorder_module_at(head.stdout.strip())
    assert old is not current and old.__name__ != current.__name__
    assert old.ProfileRecorder is not current.ProfileRecorder  # the revision's own classes, not this tree's
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
    for name in ("e1_sum", "fit_sq_sum", "fit_cross_sum", "gram_sum"):
        assert np.array_equal(getattr(profiles[0], name), getattr(profiles[1], name)), name
    # --ops: the same operations, counted by the profiler
    small = ([h[:, :8] for h in hs], [d[:, :8] for d in ds])
    assert bench.op_counts(old, 5, *small, True) == bench.op_counts(current, 5, *small, True)


def test_ops_row_lists_the_operations_whose_counts_differ(capsys):
    row = bench.ops_row(64, torch.bfloat16, True, {"aten::sub": 3, "aten::abs": 2}, {"aten::sub": 3, "aten::mul": 1})
    assert row["differ"] == {"aten::abs": (2, 0), "aten::mul": (0, 1)} and (row["old_ops"], row["new_ops"]) == (5, 4)
    assert "bfloat16" in capsys.readouterr().out


def test_loading_a_revision_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """profile_module_at extracts the old core/ to a temporary folder only while it loads it (every bench and test
    run once left a gcache-recorder-* folder behind)."""
    head = subprocess.run(["git", "-C", bench.REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("needs a git checkout")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    mod = bench.recorder_module_at(head.stdout.strip())
    assert hasattr(mod, "ProfileRecorder") and list(tmp_path.iterdir()) == []
