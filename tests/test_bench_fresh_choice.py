"""bench/fresh_choice.py runs end to end on a tiny model, and each rule's regret follows from its runs."""
import json
import statistics

from gcache.reference_model.harness import ReferenceHarness


def test_fresh_choice_bench_runs(tiny_model, capsys):
    from gcache.bench.fresh_choice import main, rules
    out = main(["--steps", "10", "--ks", "4", "--budget", "32", "--gp-seeds", "0-1", "--seed-sets", "100-101",
                "200-201", "--eval-seeds", "0-1"], harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert [(r["search_seeds"], r["K"], r["gp_seed"]) for r in out["runs"]] == \
        [("100-101", 4, 0), ("100-101", 4, 1), ("200-201", 4, 0), ("200-201", 4, 1)]
    judged = [r for r in out["runs"] if r["picks"]]
    assert judged and out["with_finalists"] == len(judged)
    for r in judged:
        psnr = {f["key"]: f["psnr"] for f in r["finalists"]}
        for name in rules():
            p = r["picks"][name]
            assert p["key"] in psnr and p["regret_db"] == round(max(psnr.values()) - psnr[p["key"]], 3) >= 0
        pick = r["finalists"][0]["key"]
        assert r["picks"]["never"]["key"] == pick
        # a rule replaces the pick only by a finalist of lower fresh loss
        fresh = {f["key"]: f["fresh_loss"] for f in r["finalists"]}
        assert all(fresh[p["key"]] <= fresh[pick] for p in r["picks"].values())
    for name in rules():
        regrets = [r["picks"][name]["regret_db"] for r in judged]
        assert out["rules"][name]["median_regret_db"] == round(statistics.median(regrets), 3)
        assert out["rules"][name]["worst_regret_db"] == max(regrets)
    assert out["rules"]["never"]["replaced"] == 0
