#!/usr/bin/env bash
# One session on a lent GPU machine, as one command (RESULTS.md, section "gpu", says
# what it gave). It checks, in this order and within fixed time limits:
#   1. `pip install -e .` into the machine's own Python, which already holds a CUDA jax
#      and torch of other versions than constraints.txt: pip must keep them (packages
#      the machine lacks come as wheels from .whl/, where one ran
#      `pip download --python-version 3.12 ... -d .whl`);
#   2. benchmarks/bench_gpu.py at GPT-2 124M, seq 1024, on the GPU (cores 0-7);
#   3. with PROFILE_S set (110 s is enough), benchmarks/profile_gpu.py: the bf16 steps of
#      the hand-written JAX GPT-2 and of cerebrax, kernel by kernel, and the programs XLA
#      made of them (extra.tgz);
#   4. meanwhile, on the CPU with those versions (cores 8-15, JAX and torch on the CPU):
#      tools/half_arith_probe.py (whether this CPU's XLA rounds float16 arithmetic as
#      torch eager does), the test suite (or the paths in TESTS) for TESTS_S seconds,
#      then the multi-device tests.
# Usage: OUT=/some/folder bash benchmarks/gpu_session.sh [bench_gpu.py options]
# It leaves eight files in OUT, the most a lent machine gives back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH_S=${BENCH_S:-420}
PROFILE_S=${PROFILE_S:-0}
PROFILE_BATCH=${PROFILE_BATCH:-32}
TESTS_S=${TESTS_S:-$((BENCH_S + PROFILE_S))}
if command -v taskset >/dev/null && [ "$(nproc)" -ge 16 ]; then
    pin_bench="taskset -c 0-7" pin_tests="taskset -c 8-15"
else
    pin_bench="" pin_tests=""
fi

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    lscpu | grep -E "Model name|^CPU\(s\)"
    grep -o -w -E "avx512f|avx512_fp16|amx_tile|amx_bf16|avx2" /proc/cpuinfo | sort | uniq -c
    $PY --version
    echo "--- before install"
    $PY -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|jax-cuda|torch|transformers|flax|optax|chex|numpy|h5py|ml.dtypes|timm|torchvision) "
    echo "--- pip install -e . (no index: wheels from .whl only)"
    $PY -m pip install --no-index --find-links .whl --no-build-isolation -e . 2>&1 | tail -4
    if ! $PY -c "import cerebrax" 2>/dev/null; then
        echo "--- install with deps failed: --no-deps"
        $PY -m pip install -q --no-index --no-deps .whl/*.whl
        $PY -m pip install -q --no-index --no-deps --no-build-isolation -e .
    fi
    $PY -m pip install -q --no-index --no-deps .whl/expecttest-*.whl  # the tests' own
    echo "--- after install"
    $PY -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|jax-cuda|torch|transformers|flax|optax|chex|numpy|h5py|ml.dtypes|greenlet|pydantic|tensorboardx) "
    $PY -c "import cerebrax, jax; print('cerebrax', cerebrax.__version__, 'jax devices', jax.devices())"
} > "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

# 4. the suite on cores 8-15, in the background
(
    export CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
    start=$SECONDS
    { $pin_tests timeout 120 $PY tools/half_arith_probe.py; echo "probe: exit $?"; } \
        > "$OUT/tests.log" 2>&1
    $pin_tests timeout "$TESTS_S" $PY -m pytest -n 8 -p no:cacheprovider -p no:benchmark -v -rfE \
        ${TESTS:-tests --ignore=tests/multidevice --ignore=tests/test_notebooks.py} \
        >> "$OUT/tests.log" 2>&1
    echo "main suite: exit $? after $((SECONDS - start)) s" >> "$OUT/tests.log"
    left=$((TESTS_S - (SECONDS - start)))
    if [ "$left" -gt 30 ]; then
        XLA_FLAGS=--xla_force_host_platform_device_count=8 $pin_tests timeout "$left" \
            $PY -m pytest -n 8 --dist loadfile -p no:cacheprovider -p no:benchmark -q -rfE tests/multidevice \
            > "$OUT/multidevice.log" 2>&1
        echo "multidevice: exit $?" >> "$OUT/multidevice.log"
    fi
) &
tests=$!

# 2. the benchmark on cores 0-7
CEREBRAX_COMPILE_CACHE=0 PYTHONUNBUFFERED=1 $pin_bench timeout "$BENCH_S" \
    $PY benchmarks/bench_gpu.py --out "$OUT/gpu.json" --results "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench: exit ${PIPESTATUS[0]}"
cp benchmarks/RESULTS.md "$OUT/RESULTS.md"

# 3. the profile, with XLA's optimized programs dumped
extra=$(mktemp -d)
if [ "$PROFILE_S" -gt 0 ]; then
    CEREBRAX_COMPILE_CACHE=0 PYTHONUNBUFFERED=1 XLA_FLAGS="--xla_dump_to=$extra/dump" \
        $pin_bench timeout "$PROFILE_S" $PY benchmarks/profile_gpu.py --batch "$PROFILE_BATCH" \
        --out "$OUT/profile.json" 2>&1 | tee "$extra/profile.log"
    $PY benchmarks/profile_gpu.py --programs "$extra/dump" --out "$extra/programs.json" >/dev/null
    (cd "$extra" && tar czf "$OUT/extra.tgz" profile.log programs.json \
        $(cd dump && ls -S | grep -m 6 after_optimizations.txt | sed 's|^|dump/|'))
fi

wait "$tests"
tail -3 "$OUT/tests.log"
grep -E " (FAILED|ERROR) " "$OUT/tests.log" | head -60
tail -15 "$OUT/multidevice.log" 2>/dev/null
