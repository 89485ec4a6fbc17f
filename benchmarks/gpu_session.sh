#!/usr/bin/env bash
# One session on a lent GPU, in one call (device time is scarce): the CUDA tests, the paper preset's GPU task (421 s
# on an H100, 2026-11-27), then benchmarks/gpu.py with the time left. Everything it leaves is under $OUT (at most 8 files):
#   env.txt            the card, driver, Python and torch
#   cuda_tests.log     `pytest tests/core -m gpu` (first: the correctness check)
#   paper.log          `python -m pipelab figures --preset paper paper_resnet20` (the learning-curve runs)
#   gpu.log, gpu.json  benchmarks/gpu.py --device cuda
#   results.tgz        the paper figure's files (paper/) and the result cache of its runs (cache/): extracted into
#                      a cache here, the figure is redrawn from a clean tree at the same code without a GPU
#                      (PIPELAB_CACHE=... python -m pipelab figures --preset paper paper_resnet20 --device cuda
#                      --cached --out figures/paper): the runs' cache keys cover the code of the modules they import
#                      (pipelab.studies.cache.PLUMBING left out), so a commit that edits one needs the runs again
# Usage (repository root, CUDA machine): OUT=/tmp/out PIPELAB_DATA=<fashion-mnist dir> bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-/tmp/gpu_session}
BUDGET=${BUDGET:-560}   # seconds for the whole script
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PIPELAB_CACHE=/tmp/pipelab_cache
t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(), \
torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)"; nproc; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# the CUDA tests first (≈ 30 s alone on an H100/H200): they are the correctness check and must not be crowded out
timeout 120 python3 -m pytest tests/core -m gpu -q -p no:cacheprovider -o addopts="-ra --strict-markers" \
  > "$OUT/cuda_tests.log" 2>&1
echo "cuda tests: rc=$? $(tail -1 "$OUT/cuda_tests.log") at $(( $(date +%s) - t0 )) s"
# then the paper task alone: processes sharing the card take turns on it (measured: 5 at once ran each 4.6×
# slower); an arm that finishes is cached, so a task stopped at its limit still leaves its finished arms (an arm
# stopped half-way is lost: a second call on the warm machine starts it again)
timeout $(( $(left) - 15 )) python3 -m pipelab figures --preset "${PRESET:-paper}" paper_resnet20 \
  --out /tmp/paper > "$OUT/paper.log" 2>&1
echo "paper task: rc=$? at $(( $(date +%s) - t0 )) s"; tail -4 "$OUT/paper.log"
tar czf "$OUT/results.tgz" -C /tmp paper pipelab_cache 2>/dev/null
# the benchmark alone on the card, with what is left
if [ "$(left)" -gt 45 ]; then
  timeout $(( $(left) - 10 )) python3 benchmarks/gpu.py --device cuda --reps 5 --json "$OUT/gpu.json" \
    > "$OUT/gpu.log" 2>&1
  echo "gpu.py: rc=$? at $(( $(date +%s) - t0 )) s"
fi
tail -40 "$OUT/gpu.log" 2>/dev/null
