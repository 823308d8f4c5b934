"""The profile written before forecast statistics were declared (tests/data/profile_v2_forecast.safetensors): the runs
it records, and how it was made.

The file was written by the GCache of commit 2656f64 (core/profile.py then held the recorder and named E1, the fit
and the Gram statistics itself), from the seeded runs below:

    .venv/bin/python tests/profile_fixture.py tests/data/profile_v2_forecast.safetensors

run with that commit's `gcache` importable. tests/test_profile_versions.py loads it with this GCache and records the
same runs again.
"""
from __future__ import annotations

import sys

import torch

TIMES = [1.0, 0.85, 0.62, 0.41, 0.2, 0.07]
SIGMAS = [1.0, 0.9, 0.7, 0.5, 0.3, 0.1]
META = {"model": "fixture", "family": "flux", "io_share": 0.05,
        "io_runs": [{"median": 0.04, "q1": 0.03, "q3": 0.05, "steps": 4}]}


def runs():
    """Two runs of two branches each: a float32 run, and a bfloat16 run sampled (max_elems) and chunked."""
    g = torch.Generator().manual_seed(2656)
    out = []
    for dtype, settings in ((torch.float32, {}), (torch.bfloat16, {"max_elems": 60, "chunk_elems": 70})):
        branches = {}
        for key in ("cond", "uncond"):
            base, drift = torch.randn(2, 9, 7, generator=g), torch.randn(2, 9, 7, generator=g)
            hs = [(torch.randn(2, 9, 7, generator=g) * 3).to(dtype) for _ in TIMES]
            ds = [(base + t * drift + 0.1 * torch.randn(2, 9, 7, generator=g)).to(dtype) for t in TIMES]
            branches[key] = (hs, ds)
        out.append((settings, branches))
    return out


def record(recorder_cls):
    """The fixture's profile: each run recorded with forecast recording on, the second merged into the first."""
    profiles = []
    for n, (settings, branches) in enumerate(runs()):
        rec = recorder_cls(TIMES, SIGMAS, dict(META), forecast=True, **settings)
        for step in range(len(TIMES)):
            for key, (hs, ds) in branches.items():
                rec.record(step, key, hs[step], ds[step])
        prof = rec.finish()
        prof.meta["sample_keys"] = [f"run{n}"]
        profiles.append(prof)
    return profiles[0].merge(profiles[1])


if __name__ == "__main__":
    try:
        from gcache.core.recorder import ProfileRecorder
    except ImportError:  # the GCache the fixture was written by (2656f64) had it in core/profile.py
        from gcache.core.profile import ProfileRecorder
    record(ProfileRecorder).save(sys.argv[1])
