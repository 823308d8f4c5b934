"""bench/choice_regret.py runs end to end on a tiny model, its regrets follow from held-out PSNRs measured again here,
a rerun resumes from its folder, and bad arguments get one line and exit code 2."""
import json
import statistics

from gcache.reference_model.harness import ReferenceHarness


def test_choice_regret_bench_runs_and_resumes(tiny_model, tmp_path, capsys):
    from gcache.bench import choice_regret
    from gcache.bench.search_setup import FittedSetup
    from gcache.search.state import SearchState
    factory = lambda n: ReferenceHarness(n, model=tiny_model)  # noqa: E731
    args = ["--steps", "10", "--ks", "4", "--budgets", "32", "--gp-seeds", "0-1", "--search-seeds", "100-101",
            "--eval-seeds", "0-1", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.json")]
    assert choice_regret.main(args, harness_factory=factory) == 0
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["command"].startswith("python -m gcache.bench.choice_regret --steps 10") and out["date"]
    assert [(r["K"], r["budget"], r["gp_seed"]) for r in out["rows"]] == [(4, 32, 0), (4, 32, 1)]
    setup = FittedSetup(type("A", (), {"steps": 10, "threads": 1, "search_seeds": "100-101", "eval_seeds": "0-1",
                                       "gp_seeds": "0-1"})(), factory)
    for r in out["rows"]:
        state = SearchState.peek(str(tmp_path / "runs" / "s100" / f"state_B32_K4_g{r['gp_seed']}.json"))
        lowest = state.best(with_final=True)["mask"]
        assert r["psnr"]["best_measured"] == setup.held_out(lowest)  # measured again, not read back
        assert r["psnr"]["start_only"] == setup.held_out(state.best(kinds=("instant",))["mask"])
        assert r["best_psnr"] == max(setup.held_out(key) for key in state.masks)
        for rule, v in r["psnr"].items():
            assert r["regret"][rule] == round(r["best_psnr"] - v, 3) >= 0
            assert r["vs_lowest_loss"][rule] == round(r["psnr"]["best_measured"] - v, 3)
    for rule, summary in out["rules"].items():
        regrets = [r["regret"][rule] for r in out["rows"]]
        assert summary["regret"]["median"] == round(statistics.median(regrets), 3)
        assert summary["regret"]["worst"] == max(regrets)
    lowest = out["rules"][out["lowest_regret_rule"]]["regret"]
    assert all(lowest["median"] <= s["regret"]["median"] + 0.01 for s in out["rules"].values())
    assert out["rules"]["best_measured"]["vs_lowest_loss"]["worst"] == 0
    capsys.readouterr()
    assert choice_regret.main(args, harness_factory=factory) == 0  # resumed: nothing sampled again
    assert "0 held out" in capsys.readouterr().out


def test_bad_arguments_get_one_line_and_exit_code_2(tmp_path, capsys):
    from gcache.bench import choice_regret
    assert choice_regret.main(["--ks", "30", "--budgets", "20", "--search-seeds", "0-3", "--eval-seeds", "2-5",
                               "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m gcache.bench.choice_regret: error:")
    assert "K = 30" in err[0] and "--budgets 20" in err[0] and "overlap" in err[0]
