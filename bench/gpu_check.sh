#!/usr/bin/env bash
# The GPU check, prepared for one lent GPU machine (under 8 minutes on an H100/H200):
#   1. bench/speed.py at Flux-dev (1024², bf16) and Wan-2.1-1.3B (81 frames 480p, CFG, bf16) sizes on cuda,
#   2. the real-ComfyUI in-process suite (family matrix, samplers/splits/nodes, what changed in 0.33) on cuda and
#      the server tests with ComfyUI's GPU defaults (0.33: Dynamic VRAM), when COMFYUI_PATH points to a ComfyUI
#      tree that travelled with the repo (carry it, e.g. as .comfyui: 31 MB for 0.33.0; never installed here).
# JSON lines and logs go to $OUT (the device tool's output folder) or ./gpu_check_out. Record the result, with the
# card and the date, in bench/RESULTS.md.
#   bash bench/gpu_check.sh                              # speed only
#   COMFYUI_PATH=$PWD/.comfyui bash bench/gpu_check.sh   # and the suite (ComfyUI carried as .comfyui)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check_out}
mkdir -p "$out"
py=${PYTHON:-python3}
# The repository root is the package `gcache` (ComfyUI imports the cloned folder): expose it under that name.
pkg=$(mktemp -d)
ln -s "$PWD" "$pkg/gcache"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$out/machine.txt"

# Step counts and repetitions sized so that both models fit the time box (Wan 1.3B: about a second a step).
run_speed() {  # model steps reps seconds
  timeout "$4" $py -m gcache.bench.speed --device cuda --model "$1" --steps "$2" --reps "$3" 2>&1 | tee "$out/speed_$1.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] && tail -n 1 "$out/speed_$1.log" >> "$out/speed.jsonl" || { echo "speed $1: exit $rc"; status=1; }
}
run_speed flux 6 3 200
run_speed wan 6 2 240

if [ -n "${COMFYUI_PATH:-}" ]; then
  # in-process on cuda; then a server with ComfyUI's GPU defaults (0.33: Dynamic VRAM streams the weights of the
  # tiny Wan the bundled workflow loads through UNETLoader, with GCache's object patches and skipped stacks)
  timeout 240 $py -m pytest -q -p no:cacheprovider tests/comfyui/test_family_matrix.py tests/comfyui/test_inprocess.py \
    tests/comfyui/test_comfyui_changes.py 2>&1 | tee "$out/comfyui_suite.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$out/comfyui_suite.log" | sed 's/^/comfyui suite: /' >> "$out/summary.txt"
  GCACHE_TEST_SERVER_GPU=1 timeout 150 $py -m pytest -q -p no:cacheprovider tests/comfyui/test_server.py \
    2>&1 | tee "$out/comfyui_server.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$out/comfyui_server.log" | sed 's/^/comfyui server on the GPU: /' >> "$out/summary.txt"
else
  echo "COMFYUI_PATH is not set: the real-ComfyUI suite was not run on cuda" | tee -a "$out/summary.txt"
fi
cat "$out/speed.jsonl" 2>/dev/null >> "$out/summary.txt"
exit $status
