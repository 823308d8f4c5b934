"""bench/l2p_keeps.py runs end to end on a tiny model, and its summary is the differences of its rows."""
import json

from gcache.reference_model.harness import ReferenceHarness


def test_l2p_keeps_bench_runs(tiny_model, capsys):
    from gcache.bench.l2p_keeps import main
    from gcache.core import forecasters
    out = main(["--steps", "8", "--k", "3", "5", "--profile-seeds", "100-101", "--eval-seeds", "0-1"],
               harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert [(r["K"], r["mask"]) for r in out["rows"]] == [(k, m) for k in (3, 5) for m in ("uniform", "fitted_dp",
                                                                                           "l2p_dp")]
    d = [r["l2p"] - r["fitted"] for r in out["rows"]]
    assert out["minus_fitted_db"]["l2p"]["min"] == round(min(d), 3)
    assert "l2p_profile_all" not in forecasters.names()  # the bench's variant is registered only while it runs
