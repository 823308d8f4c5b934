"""bench/selfcheck_cost.py runs end to end at tiny size on the plain-torch models (no ComfyUI), its summary follows
from its pairs, and bad arguments get one line and exit code 2."""
import json
import subprocess
import sys

import pytest


def test_the_bench_runs_at_tiny_size_and_its_figures_follow_from_its_runs(monkeypatch, capsys):
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    from gcache.bench.selfcheck_cost import main
    out = main(["--model", "flux", "--steps", "3", "--reps", "2"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == json.loads(json.dumps(out))
    assert "COMFYUI_PATH not set" in printed[0] and out["backend"].startswith("bench/speed_models.py")
    r = out["models"]["flux"]
    assert r["extra_s"] == pytest.approx(r["with_s"] - r["without_s"], abs=2e-5)
    assert r["extra_stack_passes"] == pytest.approx(r["extra_s"] / r["stack_pass_s"], rel=0.01, abs=0.01)
    assert len(r["pairs_stack_passes_q1_median_q3"]) == 3 and r["stacks"] == 1  # timings themselves: bench/ only
    assert r["verdict"].startswith("element error ") and "; group error " in r["verdict"]  # the replay reproduced it
    for part in r["verdict"].split("; "):
        err, tol = (float(part.split()[i].rstrip(",")) for i in (2, 4))
        assert err <= tol


@pytest.mark.parametrize("args, said", [(["--steps", "2"], "argument --steps: 2 is below 3"),
                                        (["--reps", "0"], "argument --reps: 0 is below 1"),
                                        (["--device", "tpu"], "--device tpu: cpu or cuda"),
                                        (["--size", "huge"], "invalid choice: 'huge'")])
def test_bad_arguments_get_one_line_and_exit_code_2(args, said, tmp_path):
    p = subprocess.run([sys.executable, "-m", "gcache.bench.selfcheck_cost", *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and said in lines[0], p.stderr
    assert lines[0].startswith("python -m gcache.bench.selfcheck_cost: error:") and not p.stdout
