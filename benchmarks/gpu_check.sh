#!/usr/bin/env bash
# One-shot GPU check: build rwkv._C with CUDA in place, run the CUDA op tests and the model-level
# CUDA tests, benchmark ours vs upstream, and write logs plus summary.md into OUTDIR (flat, at most
# 8 files). Made for a GPU machine with a CUDA torch, nvcc and pytest and no network; run from the
# repository root of a copy of the working tree:
#
#     benchmarks/gpu_check.sh [options] OUTDIR
#
#   --budget S          seconds for everything (default 450); every step has its own timeout,
#                       capped by what is left, so one hang cannot eat the rest
#   --sizes LIST        the benchmark's model sizes, in that order (e.g. 7b,0.4b; default: all)
#   --test-jobs N       pytest-xdist workers, where pytest-xdist is installed (default 8)
#   --bench-reserve S   seconds of the budget kept back from the benchmark (default 90)
#   --profile-size SIZE also run benchmarks/profile_gpu.py for SIZE (e.g. 0.4b), into bench.log
#   --python PATH       the Python with a CUDA torch to use (default: the first python3 or
#                       python on PATH outside .venv whose torch is a CUDA build)
#
# Upstream 0.8.32 comes from .gpu_carry/ (a wheel, installed with pip --no-deps --no-index into
# /tmp/upstream, or an unpacked folder holding rwkv/model.py). The local .venv (CPU-only torch) is
# never used. Without a GPU (e.g. a dry run on a CPU machine) the build, tests and benchmark are
# skipped with the reason, and the summary is still written. See docs/cuda.md.
set -u
usage() { sed -n '7,16p' "$0" | sed 's/^# \{0,1\}//'; }
BUDGET=450 BENCH_SIZES="" TEST_JOBS=8 BENCH_RESERVE=90 PROFILE_SIZE="" PY=""
while (($#)); do
  case $1 in
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --sizes) BENCH_SIZES=${2:?--sizes needs a list}; shift 2 ;;
    --test-jobs) TEST_JOBS=${2:?--test-jobs needs a number}; shift 2 ;;
    --bench-reserve) BENCH_RESERVE=${2:?--bench-reserve needs seconds}; shift 2 ;;
    --profile-size) PROFILE_SIZE=${2:?--profile-size needs a size}; shift 2 ;;
    --python) PY=${2:?--python needs a path}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
for n in "$BUDGET" "$TEST_JOBS" "$BENCH_RESERVE"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: expected a whole number, got '$n'" >&2; exit 2; }
done
OUT=${1:?usage: benchmarks/gpu_check.sh [options] OUTDIR (--help lists the options)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
START=$(date +%s)
SUMMARY="$OUT/summary.md"
STEPS=()  # "name|status|seconds|log"

left() { echo $((BUDGET - ($(date +%s) - START))); }

# run_step NAME MAX_SECONDS LOG CMD...: runs CMD with timeout min(MAX, budget left - 15).
run_step() {
  local name=$1 max=$2 log=$3
  shift 3
  local t
  t=$(left)
  t=$((t - 15))
  ((t > max)) && t=$max
  if ((t < 10)); then
    echo "skipped: out of time budget" >>"$OUT/$log"
    STEPS+=("$name|skipped (budget)|0|$log")
    return 1
  fi
  local s0 rc status
  s0=$(date +%s)
  echo "\$ $* (timeout ${t}s)" >>"$OUT/$log"
  timeout --kill-after=10 "$t" "$@" >>"$OUT/$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT after ${t}s" ;;
    5) status="no tests collected" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  STEPS+=("$name|$status|$(($(date +%s) - s0))|$log")
  return $rc
}

skip_step() { STEPS+=("$1|skipped: $2|0|-"); }

# ---------------------------------------------------------------- environment and python choice
ENV_LOG="$OUT/env.log"
{
  echo "date: $(date -u)"
  echo "repo: $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
  nvidia-smi 2>&1 | head -20 || echo "nvidia-smi: not available"
  (nvcc --version 2>&1 | tail -2) || echo "nvcc: not found"
} >"$ENV_LOG" 2>&1

if [[ -z $PY ]]; then
  for cand in $(type -ap python3 python 2>/dev/null); do
    case $(readlink -f "$cand") in "$REPO"/.venv/*) continue ;; esac
    [[ $cand == "$REPO"/.venv/* ]] && continue
    if "$cand" -c "import torch,sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
      PY=$cand
      break
    fi
  done
fi
GPU=0
BUILD_OK=0
WHY="no python with a CUDA build of torch on PATH (outside .venv)"
if [[ -n $PY ]]; then
  "$PY" -c "import torch; print('python', __import__('sys').version.split()[0], 'torch',
torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available() and
torch.cuda.get_device_name())" >>"$ENV_LOG" 2>&1
  if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    GPU=1
    WHY=""
  else
    WHY="torch.cuda.is_available() is False for $PY"
  fi
fi
echo "python: ${PY:-none}; GPU: $GPU ${WHY:+($WHY)}" >>"$ENV_LOG"
unset VIRTUAL_ENV PYTHONHOME
export PYTHONDONTWRITEBYTECODE=1

# ------------------------------------------------------------------------------------ the steps
if ((GPU)); then
  UP=""
  if [[ -f .gpu_carry/rwkv/model.py ]]; then
    UP="$REPO/.gpu_carry"
  elif compgen -G ".gpu_carry/*.whl" >/dev/null; then
    WHL=$(compgen -G ".gpu_carry/*.whl" | head -1)
    if run_step "install upstream wheel" 60 bench.log "$PY" -m pip install -q --upgrade --no-deps \
      --no-index --target /tmp/upstream "$WHL"; then
      UP=/tmp/upstream
    elif run_step "unpack upstream wheel (no pip)" 30 bench.log "$PY" -c \
      "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/upstream')" "$WHL"; then
      UP=/tmp/upstream  # a pure-Python wheel is importable once unpacked
    fi
  fi
  # Upstream compiles its CUDA kernels (wkv_cuda, gemm_fp16_cublas, wkv7s) with a JIT on first
  # import; do that in the background while ours builds, so the benchmark finds them cached.
  WARM_PID=""
  if [[ -n $UP ]]; then
    (cd /tmp && RWKV_CUDA_ON=1 RWKV_V7_ON=1 RWKV_JIT_ON=1 timeout 300 "$PY" -I -c \
      "import sys; sys.path.insert(0, sys.argv[1]); import rwkv.model; print('upstream kernels compiled')" \
      "$UP" >"$OUT/upstream_jit.log" 2>&1) &
    WARM_PID=$!
  fi
  export RWKV_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
  if run_step build 240 build.log "$PY" setup.py build_ext --inplace; then
    BUILD_OK=1
    run_step "backend report" 30 build.log "$PY" -c \
      "import rwkv.ops as o; print(o.backend_report())"
    # Every test that touches CUDA: tests/cuda, the cuda variants of the device-parametrised op
    # tests, the cuda-marked model tests. All of them (no -x: one run shows every failure), in
    # parallel when pytest-xdist is there, each test capped by pytest-timeout when it is there.
    PYTEST_ARGS=(-q -p no:cacheprovider -rfE)
    "$PY" -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n "$TEST_JOBS")
    "$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST_ARGS+=(--timeout 120)
    run_step "pytest tests/cuda + op cuda variants" 150 test_ops.log \
      "$PY" -m pytest tests/cuda tests/ops -k cuda "${PYTEST_ARGS[@]}"
    run_step "pytest model-level cuda tests" 150 test_models.log \
      "$PY" -m pytest tests -k "cuda and not test_cuda_compile" "${PYTEST_ARGS[@]}" \
      --ignore=tests/cuda --ignore=tests/ops
  else
    skip_step "tests" "the CUDA build failed (build.log)"
  fi
  if [[ -n $WARM_PID ]]; then
    s0=$(date +%s)
    wait "$WARM_PID"
    STEPS+=("upstream JIT compile (background)|exit $?|waited $(($(date +%s) - s0))|upstream_jit.log")
  fi
  UPARGS=(--no-upstream)
  [[ -n $UP ]] && UPARGS=(--upstream "$UP")
  [[ -z $UP ]] && echo "upstream: no wheel or folder in .gpu_carry/; ours only" >>"$OUT/bench.log"
  BENCH_BUDGET=$(($(left) - BENCH_RESERVE))
  ((BENCH_BUDGET < 30)) && BENCH_BUDGET=30
  run_step "bench_gpu.py" 400 bench.log "$PY" benchmarks/bench_gpu.py "${UPARGS[@]}" \
    --json "$OUT/bench.jsonl" --markdown "$OUT/bench.md" --budget-s "$BENCH_BUDGET" \
    ${BENCH_SIZES:+--sizes "$BENCH_SIZES"}
  # Batched decode (the BatchDecoder's steps against single-sequence calls), with what is left.
  run_step "bench_batch.py (cuda)" 120 batch.log "$PY" benchmarks/bench_batch.py --sizes 1.5b \
    --versions 7 --strategies "cuda fp16,cuda fp16i8" --batches 1,8,64,256 --steps 3
  # Optional: where a decode token's time goes (kernels and host time per token), appended to
  # bench.log, with what is left of the budget.
  if [[ -n $PROFILE_SIZE ]]; then
    run_step "profile_gpu.py --size $PROFILE_SIZE" 150 bench.log "$PY" \
      benchmarks/profile_gpu.py --size "$PROFILE_SIZE" "${UPARGS[@]}"
  fi
else
  for s in build "pytest tests/cuda + op cuda variants" "pytest model-level cuda tests" bench_gpu.py \
      "bench_batch.py (cuda)"; do
    skip_step "$s" "no GPU: $WHY"
  done
fi

# ------------------------------------------------------------------------------------- summary
{
  echo "# GPU check $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "$(tail -1 "$ENV_LOG")"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
  for s in "${STEPS[@]}"; do
    IFS='|' read -r n st sec lg <<<"$s"
    echo "| $n | $st | $sec | $lg |"
  done
  echo
  echo "total: $(($(date +%s) - START)) s of a ${BUDGET} s budget"
  for lg in test_ops.log test_models.log; do
    if [[ -f $OUT/$lg ]]; then
      echo
      echo "## $lg (last lines)"
      echo '```'
      tail -15 "$OUT/$lg"
      echo '```'
    fi
  done
  if [[ -f $OUT/bench.md ]]; then
    echo
    echo "## Benchmark"
    echo
    cat "$OUT/bench.md"
  fi
  if [[ -f $OUT/build.log ]] && ((!BUILD_OK)); then
    echo
    echo "## build.log (last lines)"
    echo '```'
    tail -25 "$OUT/build.log"
    echo '```'
  fi
} >"$SUMMARY"
rm -f "$OUT/bench.md"
echo "gpu_check: wrote $SUMMARY"
cat "$SUMMARY"
