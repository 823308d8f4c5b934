"""bench/polish_ceiling.py runs end to end on a tiny model: every one-move neighbour is measured, and its summary
follows from them."""
import json

from gcache.reference_model.harness import ReferenceHarness


def test_polish_ceiling_bench_runs(tiny_model, capsys):
    from gcache.bench.polish_ceiling import main
    n, k = 10, 4
    out = main(["--steps", str(n), "--ks", str(k), "--budget", "32", "--climb", "32", "--search-seeds", "100-101",
                "--eval-seeds", "0-1"], harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    res = out["per_k"][str(k)]
    assert res["neighbours"] == (k - 1) * (n - k)  # a computed step other than 0 swapped with a skipped one
    assert res["best_neighbour_gain_db"] >= res["lowest_loss_neighbour_gain_db"]
    assert res["neighbours_gaining_0.5db"] <= res["neighbours"] and res["accepted_neighbours"] <= res["neighbours"]
    assert (res["best_accepted_gain_db"] is None) == (res["accepted_neighbours"] == 0)
    assert res["climb"]["budget"] == 32 and res["climb"]["accepted"] <= res["climb"]["moves"]
