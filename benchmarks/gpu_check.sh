#!/usr/bin/env bash
# GPU check of the fused CUDA kernels (issue 3), in one script for a machine with a GPU:
#   1. env     what the machine has (GPU, torch, nvcc, ninja)
#   1b. hang   benchmarks/hang_nccl.py: the hang watch's cases on 2 NCCL ranks (needs 2 GPUs: on 1 it says so and
#              skips, exit 0)
#   2. build   the cuda_optim op through the loader (JIT; DSFAST_REQUIRE_OPS=1 so no silent fallback),
#              and, only if that fails, ahead of time via setup.py as a second try
#   2b. overlap benchmarks/offload_timeline.py: the offloaded step's timeline with torch.cuda.Events (gradient
#              copies to the host, host step, uploads, next forward), the same model without offload, with offload
#              serial and with overlap_step where the config has it (issue 28); offload_timeline.json in $OUT
#   3. tests   tests/gpu (parity for every dtype combination, tails, >2^31 elements, overflow skip, clip)
#   4. bench   benchmarks/gpu_optim.py (copy ceiling, Adam 1B / 10k tensors, mixed-precision step)
#   5. zero    benchmarks/gpu_zero_step.py: one rank at every ZeRO stage with and without offload, against stage 0
#   6. host    benchmarks/cpu_optim.py --only low_precision on all the host's cores: the offload step's layouts
#              (fp32, bf16, 8-bit states) as fractions of the host's bandwidth; issue 30's 8-bit / fp32 ratio where
#              the cores are many enough for the step to be memory-bound (the 2-core CI VM is compute-bound)
# Everything lands in $OUT (the device tool's output folder) or ./gpu_results: one log per stage,
# summary.txt (exit code and seconds per stage), trace.log (set -x), gpu_optim.json.
# Each stage has a timeout and the whole run stays under a budget (default 470 s, i.e. < 8 min);
# a failing stage is recorded and the next one still runs.
#
#   bash benchmarks/gpu_check.sh             # BUDGET_S=... to change the overall budget
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/gpu_results}
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: >"$SUMMARY"
exec 9>>"$OUT_DIR/trace.log"
BASH_XTRACEFD=9
set -x

START=$(date +%s)
BUDGET_S=${BUDGET_S:-470}
FAILED=0
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python}

# stage NAME LIMIT_S CMD...: run CMD with a timeout that also respects the overall budget.
stage() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  t0=$(date +%s)
  left=$((BUDGET_S - (t0 - START)))
  if [ "$left" -lt 20 ]; then
    echo "=== $name skipped: budget of ${BUDGET_S}s spent" | tee -a "$SUMMARY"
    FAILED=1
    return 99
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
  timeout -k 10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
  rc=$?
  echo "--- $name rc=$rc in $(($(date +%s) - t0))s$([ $rc -eq 124 ] && echo ' (TIMED OUT)')" | tee -a "$SUMMARY"
  tail -n 30 "$OUT_DIR/$name.log"
  [ $rc -ne 0 ] && FAILED=1
  return $rc
}

stage env 60 bash -c "nvidia-smi; $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \
\"available\", torch.cuda.is_available()); print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no GPU\")'; \
nvcc --version || ls /usr/local/cuda*/bin/nvcc; which ninja || $PY -c 'import ninja; print(ninja.__file__)'; nproc; free -g"

# early, needing no build: a second or two on one GPU (it skips), about two minutes on two
stage hang 180 $PY benchmarks/hang_nccl.py

# Compile for this GPU only (the CI build covers sm_80 and sm_90).
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null) \
    && export TORCH_CUDA_ARCH_LIST
fi

LOAD='import time, dsfast.ops as o
t = time.time(); m = o.load("cuda_optim")
print("cuda_optim loaded from", o.loaded_from("cuda_optim"), "in", round(time.time() - t, 1), "s:", m.__file__)
t = time.time(); m = o.load("cpu_optim")   # the host optimizer of the offload stages (overlap, zero)
print("cpu_optim loaded from", o.loaded_from("cpu_optim"), "in", round(time.time() - t, 1), "s:", m.__file__)'
if ! DSFAST_REQUIRE_OPS=1 stage build 300 $PY -c "$LOAD"; then
  if $PY -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    DSFAST_BUILD_OPS=cuda_optim stage build_aot 300 $PY setup.py build_ext --inplace \
      && DSFAST_REQUIRE_OPS=1 stage build_check 60 $PY -c "$LOAD"
  fi
fi

# right after the build (both ops cached): tens of seconds; without a GPU it says so and exits 0
DSFAST_REQUIRE_OPS=1 stage overlap 60 $PY benchmarks/offload_timeline.py --out "$OUT_DIR"

DSFAST_REQUIRE_OPS=1 stage tests 200 $PY -m pytest -q -rs -p no:cacheprovider tests/gpu \
  --junitxml="$OUT_DIR/tests_gpu.xml"

DSFAST_REQUIRE_OPS=1 stage bench 150 $PY benchmarks/gpu_optim.py --out "$OUT_DIR/gpu_optim.json"

DSFAST_REQUIRE_OPS=1 stage zero 120 $PY benchmarks/gpu_zero_step.py --steps 10

DSFAST_REQUIRE_OPS=1 stage host 90 $PY benchmarks/cpu_optim.py --quick --threads "$(nproc)" --only low_precision \
  --json "$OUT_DIR/cpu_optim_host.json"

{
  echo "=== total $(($(date +%s) - START))s, failed stages: $FAILED"
  grep -A20 "^=== summary" "$OUT_DIR/bench.log" 2>/dev/null
  grep -A8 "^=== summary" "$OUT_DIR/zero.log" 2>/dev/null
  grep -E "8-bit|fp32 master \+ states|no 16-bit copy|ceiling" "$OUT_DIR/host.log" 2>/dev/null | head -n 12
  grep -E "^(=== summary|offload_timeline: skipped)" "$OUT_DIR/overlap.log" 2>/dev/null
  grep -E "^(=== summary|hang_nccl: skipped)" "$OUT_DIR/hang.log" 2>/dev/null
  grep -E "passed|failed|error" "$OUT_DIR/tests.log" 2>/dev/null | tail -n 3
} | tee -a "$SUMMARY"
exit $FAILED
