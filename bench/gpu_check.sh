#!/usr/bin/env bash
# The GPU check, prepared for one GPU machine (a few minutes on an H100/H200):
#   1. bench/speed.py at Flux-dev (1024², bf16) and Wan-2.1-1.3B (81 frames 480p, CFG, bf16) sizes on cuda,
#   2. the real-ComfyUI in-process suite (family matrix, samplers/splits/nodes, what changed in 0.33) on cuda and
#      the server tests with ComfyUI's GPU defaults (0.33: Dynamic VRAM), when COMFYUI_PATH points to a ComfyUI
#      tree (one that travelled with the repo, e.g. carried as .comfyui: 31 MB for 0.33.0; never installed here).
# Python: $PYTHON if set, else README's venv (.venv/bin/python), else python3 where it imports torch (a GPU machine
# with torch in its system Python). It checks that Python, its GPU and COMFYUI_PATH before any work: one line and
# exit code 2 otherwise. JSON lines and logs go to $OUT or ./gpu_check_out (git ignores it); then, in the clone,
#   .venv/bin/python -m gcache.bench.runs --import gpu_check <that folder>
# stores them for the docs' figures. Its temporary folder is removed on exit.
#   bash bench/gpu_check.sh                              # speed only
#   COMFYUI_PATH=$PWD/.comfyui bash bench/gpu_check.sh   # and the suite (ComfyUI carried as .comfyui)
set -uo pipefail
cd "$(dirname "$0")/.."
die() { echo "bash bench/gpu_check.sh: error: $*" >&2; exit 2; }

if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
elif [ -x .venv/bin/python ]; then
  py=.venv/bin/python
elif command -v python3 >/dev/null 2>&1 && python3 -c "import torch" >/dev/null 2>&1; then
  py=python3
else
  die "no Python with torch: make README's venv (.venv, see README.md: Try it without ComfyUI) or set PYTHON"
fi
"$py" -c "import torch" >/dev/null 2>&1 || die "$py cannot import torch: install README's venv (.venv) or set PYTHON"
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 ||
  die "$py's torch sees no CUDA GPU: run this on the GPU machine"
if [ -n "${COMFYUI_PATH:-}" ] && { [ ! -f "$COMFYUI_PATH/main.py" ] || [ ! -d "$COMFYUI_PATH/comfy" ]; }; then
  die "COMFYUI_PATH=$COMFYUI_PATH is no ComfyUI folder (no main.py and comfy/): set it to one, or leave it unset"
fi

out=${OUT:-gpu_check_out}
mkdir -p "$out"
# The repository root is the package `gcache` (ComfyUI imports the cloned folder): expose it under that name.
pkg=$(mktemp -d "${TMPDIR:-/tmp}/gcache-gpu-check.XXXXXX")
trap 'rm -rf "$pkg"' EXIT
ln -s "$PWD" "$pkg/gcache"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$out/machine.txt"

# Step counts and repetitions sized so that both models fit the time box (Wan 1.3B: about a second a step).
run_speed() {  # model steps reps seconds
  timeout "$4" "$py" -m gcache.bench.speed --device cuda --model "$1" --steps "$2" --reps "$3" 2>&1 | tee "$out/speed_$1.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] && tail -n 1 "$out/speed_$1.log" >> "$out/speed.jsonl" || { echo "speed $1: exit $rc"; status=1; }
}
run_speed flux 6 3 200
run_speed wan 6 2 240

if [ -n "${COMFYUI_PATH:-}" ]; then
  # in-process on cuda; then a server with ComfyUI's GPU defaults (0.33: Dynamic VRAM streams the weights of the
  # tiny Wan the bundled workflow loads through UNETLoader, with GCache's object patches and skipped stacks)
  timeout 240 "$py" -m pytest -q -p no:cacheprovider tests/comfyui/test_family_matrix.py tests/comfyui/test_inprocess.py \
    tests/comfyui/test_comfyui_changes.py 2>&1 | tee "$out/comfyui_suite.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$out/comfyui_suite.log" | sed 's/^/comfyui suite: /' >> "$out/summary.txt"
  GCACHE_TEST_SERVER_GPU=1 timeout 150 "$py" -m pytest -q -p no:cacheprovider tests/comfyui/test_server.py \
    2>&1 | tee "$out/comfyui_server.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$out/comfyui_server.log" | sed 's/^/comfyui server on the GPU: /' >> "$out/summary.txt"
else
  echo "COMFYUI_PATH is not set: the real-ComfyUI suite was not run on cuda" | tee -a "$out/summary.txt"
fi
cat "$out/speed.jsonl" 2>/dev/null >> "$out/summary.txt"
exit $status
