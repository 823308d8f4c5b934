"""bench/auto_error_models.py end to end on a small N: every error model that applies is a candidate, and auto's
own choice ("today") is its forecaster's mean-|error| mask, so that model's difference to today is exactly 0."""
from __future__ import annotations

import math

from gcache.bench import auto_error_models
from gcache.core import forecasters
from gcache.search import error_models


def test_auto_error_models_bench_runs(capsys):
    out = auto_error_models.main(["--steps", "8", "--eval-seeds", "0-1"])
    assert out["rows"] and all(any(c.endswith("/ls_rms") for c in r["candidates"]) for r in out["rows"])
    for row in out["rows"]:
        fc = row["today"].split("/")[0]
        assert row["today"].endswith("/mean_abs") and row["model_minus_today_db"]["mean_abs"] == 0
        for name, c in row["candidates"].items():
            f, model = name.split("/")
            assert error_models.applies(model, forecasters.get(f)) and math.isfinite(c["psnr"])
        assert ("ls_rms" in row["model_minus_today_db"]) == (forecasters.get(fc).keeps >= 2)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("{")
