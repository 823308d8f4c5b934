"""bench/auto_error_models.py end to end on a small N: every error model that applies is a candidate, the "auto" column
is what GCache Apply (auto) applies (search/instant.py auto_policy on choose_forecaster's pick), and "own_dp" is that
forecaster on its own DP mask, so that model's difference to own_dp is exactly 0."""
from __future__ import annotations

import math

import pytest

from gcache.bench import auto_error_models
from gcache.core import forecasters
from gcache.reference_model.harness import ReferenceHarness
from gcache.search import error_models
from gcache.search.instant import auto_policy, choose_forecaster


def test_auto_error_models_bench_runs(capsys):
    out = auto_error_models.main(["--steps", "10", "--eval-seeds", "0-1"])
    prof = ReferenceHarness(10).profile(list(range(1000, 1008)), forecast=True)
    assert out["rows"] and all(any(c.endswith("/ls_rms") for c in r["candidates"]) for r in out["rows"])
    for row in out["rows"]:
        fc = row["own_dp"].split("/")[0]
        assert row["own_dp"].endswith("/mean_abs") and row["model_minus_own_dp_db"]["mean_abs"] == 0
        pick = choose_forecaster(prof, row["K"])[0]
        assert fc == pick and row["auto"].startswith(pick + "/")
        model = row["auto"].split("/")[1]  # the mask Apply (auto) applies its pick on
        assert instant_mask(prof, row["K"], pick, model) == auto_policy(prof, row["K"], pick).mask
        for name, c in row["candidates"].items():
            f, m = name.split("/")
            assert error_models.applies(m, forecasters.get(f)) and math.isfinite(c["psnr"])
        assert ("ls_rms" in row["model_minus_own_dp_db"]) == (forecasters.get(fc).keeps >= 2)
        # the bound's pick between auto's policy and each candidate's own DP policy, recomputed from the candidates
        own = [row["auto"]] + [n for n in row["candidates"] if n.endswith("/mean_abs")]
        low = min(row["candidates"][n]["bound"] for n in own)
        assert row["candidates"][row["own_masks_by_bound"]]["bound"] == low and row["own_masks_by_bound"] in own
        assert row["own_masks_by_bound_minus_auto_db"] == pytest.approx(
            row["candidates"][row["own_masks_by_bound"]]["psnr"] - row["auto_psnr"], abs=0.011)
    s = out["own_masks_by_bound_minus_auto"]
    assert out["own_masks_by_bound_keep"] == (s["median"] > 0 and s["min"] >= -1.0)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("{")


def instant_mask(prof, k, fc, model):
    from gcache.search.instant import instant_policy
    return instant_policy(prof, k, "theory", forecast=fc, error_model=model).mask
