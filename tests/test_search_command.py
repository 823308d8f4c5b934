"""The headless search command and bench/quality.py run end to end (tiny random-weight model, tiny budget)."""
import json

from gcache.core.policy import Policy
from gcache.reference_model.harness import ReferenceHarness


def test_search_command_writes_policy_state_and_png(tmp_path, tiny_model, capsys):
    from gcache.reference_model.search import main
    args = ["--steps", "8", "--k", "3", "--budget", "12", "--degree", "2", "--objective", "ssim",
            "--search-seeds", "100-101", "--eval-seeds", "0-1", "--out", str(tmp_path)]
    assert main(args, harness=ReferenceHarness(8, model=tiny_model)) == 0
    pol = Policy.load(str(tmp_path / "policy_N8_K3.json"))
    assert pol.method == "gcache" and pol.n_computed == 3 and pol.provenance["seeds"] == [100, 101]
    assert "eval_psnr" in pol.metrics and pol.provenance["objective"] == "ssim"
    state = json.loads((tmp_path / "search_state_N8_K3.json").read_text())
    assert state["done"] and len(state["history"]) == 12
    assert (tmp_path / "search_N8_K3.png").read_bytes()[:4] == b"\x89PNG"
    # a rerun resumes from the finished state and writes the same policy
    assert main(args, harness=ReferenceHarness(8, model=tiny_model)) == 0
    assert Policy.load(str(tmp_path / "policy_N8_K3.json")).mask == pol.mask
    # what it prints of the speed-up is what the policy says (search/result.py: one computation)
    from gcache.search.result import predicted_speedup_text
    assert predicted_speedup_text(pol) in capsys.readouterr().out and pol.metrics["predicted_speedup"] > 1
    # overlapping seeds are refused
    assert main(args[:-6] + ["--search-seeds", "0-1", "--eval-seeds", "1-2", "--out", str(tmp_path)]) == 2
    assert "overlap" in capsys.readouterr().err


def test_a_fitted_search_command_checks_the_other_forecaster_and_measures_its_policy(tmp_path, tiny_model, capsys):
    from gcache.reference_model.search import main
    h = ReferenceHarness(8, model=tiny_model)
    args = ["--steps", "8", "--k", "3", "--budget", "24", "--degree", "2", "--objective", "ssim", "--forecast",
            "fitted", "--search-seeds", "100-101", "--eval-seeds", "0-1", "--out", str(tmp_path)]
    assert main(args, harness=h) == 0
    pol = Policy.load(str(tmp_path / "policy_N8_K3.json"))
    state = json.loads((tmp_path / "search_state_N8_K3.json").read_text())
    checks = {k: m for k, m in state["masks"].items() if m["kind"] == "check"}  # the check ran, once
    checked = {m["of"] for m in checks.values()}.pop()  # the candidate it checked, under the other forecasters
    base = checked.partition("@")[2] or "fitted"
    from gcache.search.end_game import chooses_among
    everyone = set(chooses_among("fitted"))  # fitted, l2p and the fixed rules
    bits = checked.partition("@")[0]
    measured = {(k.partition("@")[2] or "fitted") for k in state["masks"] if k.partition("@")[0] == bits}
    assert state["config"]["forecast"] == "fitted" and {k.partition("@")[2] or "fitted" for k in checks} <= everyone
    assert measured == everyone  # the checked mask under each of them (some measured before the check)
    assert any(h["mask"].endswith("@l2p") for h in state["history"])  # l2p's start masks were measured
    assert pol.forecast in everyone and pol.provenance["forecast"]["check"]["searched_with"] == base
    assert pol.metrics["eval_psnr"] == h.held_out(pol, [0, 1])["eval_psnr"]  # under the policy's own forecaster
    assert f"forecaster {pol.forecast}" in capsys.readouterr().out


def test_quality_bench_runs(tiny_model, capsys):
    from gcache.bench.quality import METHODS, main
    out = main(["--steps", "6", "--budget", "24", "--degree", "2", "--search-seeds", "100-101", "--eval-seeds", "0-1",
                "--objective", "psnr", "--gp-seeds", "0-1"],
               harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(out))
    assert {r["method"] for r in out["rows"]} == set(METHODS) and {r["K"] for r in out["rows"]} == {2, 3, 4}
    for key in ("gcache_minus_best_baseline_psnr_at_half", "evaluations", "gp_seconds_per_iter_at_end"):
        assert key in out
    assert set(out["search_minus_best_other_psnr"]) == set(out["polish_gain_db"]) == {"2", "3", "4"}
    assert {r["method"] for r in out["rows"] if r["method"].startswith(("spectrum_", "l2p_"))
            and not r["method"].endswith("_auto_mask")} == \
        {f"{r}_{m}" for r in ("spectrum", "spectrum_mix", "l2p", "l2p_all") for m in ("uniform", "gcache_mask")}
    at = {(r["K"], r["method"]): r["psnr"] for r in out["rows"]}
    for k, fc in out["auto_forecaster"].items():  # auto's forecaster on auto's mask is auto's instant policy
        assert at[(int(k), f"{fc}_auto_mask")] == at[(int(k), "instant_auto")]
        assert {"instant_l2p", "l2p_auto_mask", "reuse_auto_mask"} <= {m for (kk, m) in at if kk == int(k)}
        cost = out["forecast_search_cost"][k]
        assert cost["start_masks"] >= cost["other_forecaster_starts"] >= 0 and cost["check_evaluations"] >= 0 \
            and cost["fresh_evaluations"] in (0, 2, 3) and isinstance(cost["fresh_replaced"], bool)
    assert all(v["with_other_forecasters"] >= v["own_start_masks_only"] for v in out["budget_floor"].values())
    for k in ("2", "3", "4"):  # the forecast keys are the differences of the rows they name
        fit = at[(int(k), "instant_fitted")] - at[(int(k), "instant_linear")]
        inst = at[(int(k), "instant_auto")] - at[(int(k), "instant_1batch")]
        assert abs(out["fitted_minus_linear_db"][k] - fit) < 2e-3
        assert abs(out["instant_forecast_minus_reuse_db"][k] - inst) < 2e-3
        assert out["auto_forecaster"][k] in ("reuse", "linear", "fitted")
        runs = out["polish_runs"][k]  # the polish gain is the median of the paired per-GP-seed differences
        assert set(runs) == {"0", "1"} and abs(out["polish_gain_db"][k] - sorted(
            r["polish"]["psnr"] - r["nopolish"]["psnr"] for r in runs.values())[0] / 2 -
            sorted(r["polish"]["psnr"] - r["nopolish"]["psnr"] for r in runs.values())[1] / 2) < 2e-3
        others = {m: p for (kk, m), p in at.items() if kk == int(k) and m not in ("gcache", "gcache_forecast",
                                                                                  "gcache_forecast_nopolish")}
        assert abs(out["forecast_search_minus_best_other_psnr"][k]["margin_db"]
                   - (at[(int(k), "gcache_forecast")] - max(others.values()))) < 2e-3
