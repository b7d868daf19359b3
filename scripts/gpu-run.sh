#!/usr/bin/env bash
# The GPU suite runner (copied to gpu-bin/run.sh by scripts/build-gpu.sh).
#   bash gpu-bin/run.sh            the Python wheel installed in a virtual environment and
#                                  checked, every test binary with CUDA_RT_REQUIRE_GPU=1
#                                  (the framework workloads also from the wheel), the C
#                                  smoke and API programs, then every example (exit 0, no skip)
#   SANITIZE=1 bash gpu-bin/run.sh the same under compute-sanitizer memcheck
#   BENCH=1 bash gpu-bin/run.sh    then every bench binary (JSON lines + tables), `cuda-rt
#                                  bench` and the serving workloads (tests/python/serving.py,
#                                  figures)
#   ONLY=word bash gpu-bin/run.sh  only the test and example binaries named with `word`
#   TEST_FILTER=name ...           passes `name` to each test binary (libtest's filter)
#   SKIP=w1,w2 bash gpu-bin/run.sh all but the test binaries named with any of the words (e.g. the
#                                  framework workloads under the sanitizer)
#   TEST_TIMEOUT=s ...             each test binary's limit (default 300 s, 600 s under the
#                                  sanitizer); the framework workloads (python_workloads, about
#                                  220 s alone on an H100, more beside other binaries) get
#                                  PY_TEST_TIMEOUT (default 600 s, 1800 s under the sanitizer)
# Ends with one line: `N passed, N failed`.
set -u
SKIP=${SKIP:-}
# Tests that judge work held behind a gate accept a gate timed out by the sanitizer
# (which can make queued copies wait) only when told they run under it.
if [ "${SANITIZE:-0}" = 1 ]; then export CUDA_RT_UNDER_SANITIZER=1; fi
HERE=$(cd "$(dirname "$0")" && pwd)
export CUDA_RT_REQUIRE_GPU=1
export CUDA_RT_SHIM_DIR="$HERE/lib"
# The C programs ask the loader for the soname, libcuda_rt_c.so.0: the link made by
# build-gpu.sh, made again here where a copy of gpu-bin/ dropped it.
[ -e "$HERE/lib/libcuda_rt_c.so.0" ] || ln -sf libcuda_rt_c.so "$HERE/lib/libcuda_rt_c.so.0"
export CUDA_RT_C_SMOKE="$HERE/c_smoke"
export CUDA_RT_C_TEARDOWN="$HERE/c_teardown"
export CUDA_RT_C_API="$HERE/c_api"
export CUDA_RT_C_SAXPY="$HERE/examples/c_saxpy"
# The `cuda-rt` command, for its tests (cuda_rt_cli__test__cli).
export CUDA_RT_CLI="$HERE/cuda-rt"
# The Python module beside gpu-bin in the checkout (python/cuda_rt_alloc.py).
export CUDA_RT_PYTHON_DIR="$HERE/../python"
export LD_LIBRARY_PATH="$HERE/lib:${LD_LIBRARY_PATH:-}"
OUTDIR=${OUT:-/tmp}
# Figures of tests that measure (the framework workloads) are appended here.
export CUDA_RT_FIGURES="$OUTDIR/figures.txt"
passed=0; failed=0; failed_bins=()
# The wheel (gpu-bin/wheel/*.whl) in a virtual environment that also sees the machine's
# torch and CuPy (--system-site-packages): checked here (tests/python/wheel_check.py),
# then tests/python_workloads.rs runs the framework workloads from it
# (CUDA_RT_WHEEL_PYTHON). Installed offline: the wheel has no dependencies.
WHEEL_VENV=$(mktemp -d "${TMPDIR:-/tmp}/cuda-rt-wheel-venv.XXXXXX")
trap 'rm -rf "$WHEEL_VENV"' EXIT
install_wheel() {
  local whl
  whl=$(ls "$HERE"/wheel/cuda_rt_alloc-*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then echo "no wheel in $HERE/wheel"; return 1; fi
  if python3 -m venv --clear --system-site-packages "$WHEEL_VENV"; then
    "$WHEEL_VENV/bin/python" -m pip install --quiet --no-index --no-deps "$whl"
  else
    # A Python without ensurepip: a venv without pip, the system's pip installing in it.
    python3 -m venv --clear --without-pip --system-site-packages "$WHEEL_VENV" &&
      python3 -m pip --python "$WHEEL_VENV/bin/python" install --quiet --no-index --no-deps "$whl"
  fi
}
wheel_log="$OUTDIR/wheel.log"
if install_wheel >"$wheel_log" 2>&1 &&
   (cd "$WHEEL_VENV" && env -u PYTHONPATH -u CUDA_RT_C_LIB WHEEL_CHECK_NEEDS_DRIVER=1 \
     "$WHEEL_VENV/bin/python" "$HERE/../tests/python/wheel_check.py") >>"$wheel_log" 2>&1; then
  export CUDA_RT_WHEEL_PYTHON="$WHEEL_VENV/bin/python"
  passed=$((passed + 1))
  printf '%-50s passed (%s)\n' "wheel" "$(tail -1 "$wheel_log")"
else
  failed=$((failed + 1)); failed_bins+=("wheel")
  printf '%-50s FAILED\n' "wheel"; tail -20 "$wheel_log"
fi
run() {
  local limit
  if [[ "$(basename "$1")" == *python_workloads* ]]; then
    # The framework workloads train and serve real models: their own, longer limit.
    if [ "${SANITIZE:-0}" = 1 ]; then limit=${PY_TEST_TIMEOUT:-1800}; else limit=${PY_TEST_TIMEOUT:-600}; fi
  elif [ "${SANITIZE:-0}" = 1 ]; then
    limit=${TEST_TIMEOUT:-600}
  else
    limit=${TEST_TIMEOUT:-300}
  fi
  if [ "${SANITIZE:-0}" = 1 ]; then
    timeout "$limit" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 "$@"
  else
    timeout "$limit" "$@"
  fi
}
for bin in "$HERE"/tests/*${ONLY:-}*; do
  name=$(basename "$bin")
  left_out=""
  for word in ${SKIP//,/ }; do
    if [[ "$name" == *"$word"* ]]; then left_out=$word; fi
  done
  if [ -n "$left_out" ]; then echo "$name: left out (SKIP=$SKIP)"; continue; fi
  log="$OUTDIR/test-$name.log"
  # TEST_FILTER: libtest's name filter (e.g. one test of a binary).
  # shellcheck disable=SC2086
  run "$bin" --test-threads="${TEST_THREADS:-4}" ${TEST_FILTER:-} >"$log" 2>&1
  rc=$?
  # A binary that never touches CUDA makes compute-sanitizer exit 255 after its tests pass.
  if [ "${SANITIZE:-0}" = 1 ] && [ $rc -eq 255 ] && grep -q "terminated before first instrumented API call" "$log"; then rc=0; fi
  p=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  printf '%-50s %4d passed %3d failed (rc %d)\n' "$name" "$p" "$f" "$rc"
  if [ $rc -ne 0 ]; then failed_bins+=("$name"); grep -E "panicked|FAILED|failed|ERROR" "$log" | head -20; fi
done
for c in c_smoke c_api; do
  if "$HERE/$c" >"$OUTDIR/$c.log" 2>&1; then
    passed=$((passed + 1)); echo "$c: passed"
  else
    failed=$((failed + 1)); failed_bins+=("$c"); cat "$OUTDIR/$c.log"
  fi
done
# `cuda-rt info` must see the GPU: exit 0 and no "no GPU:" line. Its report is printed
# (the machine's CUDA, for the run's notes).
if run "$HERE/cuda-rt" info >"$OUTDIR/cuda-rt-info.log" 2>&1 && ! grep -q "no GPU:" "$OUTDIR/cuda-rt-info.log"; then
  passed=$((passed + 1)); echo "cuda-rt info: passed"
else
  failed=$((failed + 1)); failed_bins+=("cuda-rt info"); echo "cuda-rt info: FAILED"
fi
cat "$OUTDIR/cuda-rt-info.log"
# Every example runs in full here: a non-zero exit, a timeout, or a `skipped:` line (no
# GPU, no NVRTC, no cuBLAS...) fails it, as a skipped GPU test fails under
# CUDA_RT_REQUIRE_GPU=1. Each takes a few seconds; EXAMPLE_TIMEOUT bounds a hang.
run_example() {
  if [ "${SANITIZE:-0}" = 1 ]; then
    timeout "${EXAMPLE_TIMEOUT:-300}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 "$@"
  else
    timeout "${EXAMPLE_TIMEOUT:-60}" "$@"
  fi
}
for ex in "$HERE"/examples/*${ONLY:-}*; do
  [ -e "$ex" ] || continue
  name=$(basename "$ex")
  log="$OUTDIR/example-$name.log"
  start=$SECONDS
  run_example "$ex" >"$log" 2>&1
  rc=$?
  why=""
  if [ $rc -eq 124 ]; then why="timed out after $((SECONDS - start)) s"
  elif [ $rc -ne 0 ]; then why="exit status $rc"
  elif grep -q '^skipped:' "$log"; then why="$(grep -m1 '^skipped:' "$log")"
  fi
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    printf '%-50s passed in %d s\n' "$name" $((SECONDS - start))
  else
    failed=$((failed + 1)); failed_bins+=("$name")
    printf '%-50s FAILED: %s\n' "$name" "$why"
    tail -20 "$log"
  fi
done
if [ "${BENCH:-0}" = 1 ]; then
  for b in "$HERE"/benches/*; do
    [ -e "$b" ] || continue
    echo "== bench $(basename "$b")"
    timeout "${BENCH_TIMEOUT:-180}" "$b" --bench 2>&1 | tee "$OUTDIR/bench-$(basename "$b").log" | tail -60
  done
  echo "== cuda-rt bench"
  timeout "${BENCH_TIMEOUT:-180}" "$HERE/cuda-rt" bench 2>&1 | tee "$OUTDIR/cuda-rt-bench.log"
  # The serving workloads (figures only): drifting shapes on each framework's allocator
  # and on cuda-rt's drop-in (tests/python/serving.py); skipped where torch or CuPy is
  # not installed.
  for fw in torch cupy; do
    if python3 -c "import $fw" >/dev/null 2>&1; then
      echo "== serving $fw"
      PYTHONPATH="$CUDA_RT_PYTHON_DIR" CUDA_RT_C_LIB="$HERE/lib/libcuda_rt_c.so" \
        timeout "${SERVING_TIMEOUT:-400}" python3 "$HERE/../tests/python/serving.py" "$fw" \
        2>&1 | tee "$OUTDIR/serving-$fw.log" | grep '^figure:'
    else
      echo "== serving $fw: skipped ($fw is not installed)"
    fi
  done
fi
[ ${#failed_bins[@]} -gt 0 ] && echo "failing: ${failed_bins[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
