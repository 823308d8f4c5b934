"""The headless demo and the engine benchmark run end to end (tiny settings) and write what they promise."""
import json

from gcache.bench import engine as bench_engine
from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.reference_model import demo


def test_demo_writes_profile_policy_grid(tmp_path, capsys):
    demo.main(["--steps", "8", "--k", "4", "--profile-seeds", "2", "--eval-seeds", "2", "--repeats", "1",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "N = 8, K = 4" in out and "PSNR" in out and "measured" in out
    pol = Policy.load(str(tmp_path / "policy.json"))
    assert pol.n_steps == 8 and pol.n_computed == 4 and pol.metrics["ssim"] <= 1.0
    assert Profile.load(str(tmp_path / "profile.safetensors")).count == 2  # 1 run × 2 CFG branches
    assert (tmp_path / "grid.png").stat().st_size > 0


def test_engine_bench_ends_with_json(capsys):
    bench_engine.main(["--steps", "6", "--batch", "1", "--repeats", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    row = json.loads(last)
    for key in ("overhead_all_ones", "speedup_half", "ideal_half", "speedup_ratio", "profile_peak_extra_mb"):
        assert key in row
    assert row["ideal_half"] > 1.0
