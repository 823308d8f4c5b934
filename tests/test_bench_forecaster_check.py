"""bench/forecaster_check.py runs end to end on a tiny model, and its summary follows from its runs."""
import json
import statistics

from gcache.reference_model.harness import ReferenceHarness


def test_forecaster_check_bench_runs(tiny_model, capsys):
    from gcache.bench.forecaster_check import main, rules
    RULES = rules()
    out = main(["--steps", "10", "--ks", "4", "--budget", "32", "--gp-seeds", "0-1", "--search-seeds", "100-101",
                "--eval-seeds", "0-1"], harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert [(r["K"], r["gp_seed"]) for r in out["runs"]] == [(4, 0), (4, 1)]
    for r in out["runs"]:
        # every forecaster the search chooses among (the fixed rules too; and any a test registered)
        assert {"fitted", "l2p", "reuse", "linear", "quadratic"} <= set(r["psnr"]) == set(r["loss"])
        base = r["searched_with"]  # the forecaster of the candidate the search returned (l2p's masks are starts too)
        assert base in ("fitted", "l2p")
        for rule in RULES:
            p = r["picks"][rule]
            assert p["gain_db"] == round(r["psnr"][p["forecaster"]] - r["psnr"][base], 3)
        assert r["picks"]["never"]["forecaster"] == base
        # a rule switches only to a forecaster with a lower loss on the search's seeds
        assert all(r["loss"][p["forecaster"]] <= r["loss"][base] for p in r["picks"].values())
    for rule in RULES:
        gains = [r["picks"][rule]["gain_db"] for r in out["runs"]]
        assert out["rules"][rule]["median_gain_db"] == round(statistics.median(gains), 3)
        assert out["rules"][rule]["worst_gain_db"] == min(gains)
    assert out["rules"]["never"]["switched"] == 0
