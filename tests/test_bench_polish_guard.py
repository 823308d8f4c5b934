"""bench/polish_guard.py runs end to end on a tiny model, and its summary follows from its runs."""
import json
import statistics

from gcache.reference_model.harness import ReferenceHarness


def test_polish_guard_bench_runs(tiny_model, capsys):
    from gcache.bench.polish_guard import main
    out = main(["--steps", "10", "--ks", "4", "--budget", "32", "--gp-seeds", "0-1", "--search-seeds", "100-103",
                "--eval-seeds", "0-1"], harness_factory=lambda n: ReferenceHarness(n, model=tiny_model))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert [(r["K"], r["gp_seed"]) for r in out["runs"]] == [(4, 0), (4, 1)]
    for guard in ("halves", "z"):
        assert out["median_gain_db"][guard]["4"] == round(statistics.median(
            r["guards"][guard]["psnr"] - r["no_polish"] for r in out["runs"]), 3)
    d = [r["guards"]["z"]["psnr"] - r["guards"]["halves"]["psnr"] for r in out["runs"]]
    vs = out["z_vs_halves"]
    assert vs["better"] + vs["worse"] + vs["same"] == 2 and vs["better"] == sum(v > 1e-9 for v in d)
