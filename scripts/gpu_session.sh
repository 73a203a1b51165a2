#!/usr/bin/env bash
# Issue 11's checks on a lent NVIDIA GPU machine (python3 3.12 with jax[cuda], flax, optax,
# orbax, numba and triton; no network), prepared here and run there.
#
#   bash scripts/gpu_session.sh fetch            # here: .gpu/whl (wheels the GPU image lacks)
#                                                # and .gpu/pfam (the Pfam data), git-ignored
#   bash scripts/gpu_session.sh replica          # here, no GPU: the lent machine's jax (GPU_JAX, 0.11.2)
#                                                # in a Python 3.12 venv: every variant compiled for a
#                                                # described H100 by XLA's Triton, the kernel tests in
#                                                # interpret mode and lowered, `pytest -m gpu` collected,
#                                                # issue11's and train's scripts at a small size
#                                                # (PYTHON312 names the interpreter; ~8 min on 2 cores)
#   then, on the GPU machine, with .gpu carried, one step per call (each under 10 minutes):
#   bash scripts/gpu_session.sh issue11          # the whole check in one call (< 9.5 min, a 15-minute lease
#                                                # has room for one): targets (timed, gradients checked), then
#                                                # the compiled-kernel tests, then the per-kernel profile of
#                                                # auto's variant, then the spoke dustbin at L 16384, each
#                                                # part under its own time limit; a short table last
#   bash scripts/gpu_session.sh rest             # what issue11 leaves, one call (< 7 min): the compiled one-plan
#                                                # and cold-score tests, k2_eps1's training throughput, the
#                                                # spoke dustbin at L 4096 and 8192 (most wanted first)
#   bash scripts/gpu_session.sh tests            # pytest -m gpu: compiled Triton kernels
#   bash scripts/gpu_session.sh targets          # bench_transport at issue 11's sizes (L 4096, 16384): dense,
#                                                # ott-jax, xla and the stored-band variants ("ieee" and
#                                                # tf32x3 dots): the three targets as PASS / MISS, one call
#   bash scripts/gpu_session.sh resident         # bench_transport: reference, xla, pallas-resident, its
#                                                # unrolled steps, pallas-fused and pallas-one-pass (the stored-band kernels,
#                                                # not yet run on hardware), all sizes
#   bash scripts/gpu_session.sh transport        # bench_transport: reference, xla, pallas, ott
#   bash scripts/gpu_session.sh train            # bench_train: k2_eps1 and align_ce
#   bash scripts/gpu_session.sh tune             # tune_triton: tiling sweep, then the tuned op
#                                                # (add --impl pallas-resident for the stored-band kernels)
#   bash scripts/gpu_session.sh profile          # profile_transport: time per kernel, and the HLO
#   bash scripts/gpu_session.sh flags            # bench_transport (reference, xla, xla-branch-free, -unrolled) under
#                                                # each of XLA_FLAG_SETS: loop unrolling, command buffers
#
# Every step installs the wheels and this checkout (offline, editable) first, then writes
# device.txt (GPU, driver, date, jax) and its own log / JSON lines to $OUT (default
# /tmp/gpu_out). The README's "Next on a GPU" says what to do with the figures.
set -euo pipefail
cd "$(dirname "$0")/.."

# What pfamalign needs that the GPU image does not hold, at the versions tested here; and
# pytest-xdist (with execnet), which `issue11` runs the compiled tests on (-n 8): whether the
# image has it is not known (its one run, 2026-11-24, was on one process).
WHEELS="biopython==1.88 grain==0.2.18 array-record==0.8.6 ott-jax==0.6.0 jaxopt==0.8.5 portpicker==1.6.0
  pytest-xdist==3.8.0 execnet==2.1.2"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

fetch() {
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    for ignored in /.gpu/ /.gpu.tmp/; do
        grep -qx "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >> "$exclude"
    done
    # built beside .gpu and swapped in whole: a failed download leaves the previous .gpu
    rm -rf .gpu.tmp && mkdir -p .gpu.tmp/whl
    # shellcheck disable=SC2086  # the lists are word lists
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        $PLATFORMS -d .gpu.tmp/whl $WHEELS
    cp -r ../shared/data/pfam .gpu.tmp/pfam
    rm -rf .gpu && mv .gpu.tmp .gpu
    du -sh .gpu/whl .gpu/pfam
}

install() {
    compgen -G ".gpu/whl/*.whl" > /dev/null || {
        echo "error: no wheels in .gpu/whl: run 'bash scripts/gpu_session.sh fetch' on the host first," \
             "then carry .gpu" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu_site .gpu/whl/*.whl
    export PYTHONPATH=/tmp/gpu_site
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
    OUT_DIR=${OUT:-/tmp/gpu_out}
    mkdir -p "$OUT_DIR"
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c "import jax; print('jax', jax.__version__, jax.devices())"; } | tee "$OUT_DIR/device.txt"
    export PYTHONUNBUFFERED=1
}

# The jax of the lent GPU image (device.txt, 2026-11-24), which has no wheels for Python 3.11.
GPU_JAX=${GPU_JAX:-0.11.2}
replica() {
    local py=${PYTHON312:-python3.12} venv=${REPLICA_VENV:-/tmp/gpu_replica} out=${OUT:-/tmp/gpu_replica_out}
    "$py" -c 'import sys; assert sys.version_info[:2] >= (3, 12)' 2>/dev/null || {
        echo "error: replica needs Python >= 3.12 (jax $GPU_JAX has no wheels for older ones): set PYTHON312" >&2
        exit 2; }
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "jax==$GPU_JAX" "jaxlib==$GPU_JAX" "jax-cuda13-plugin==$GPU_JAX" \
        "jax-cuda13-pjrt==$GPU_JAX" -e ".[test]"
    mkdir -p "$out"
    "$venv/bin/python" -c "import jax; print('jax', jax.__version__, 'on Python', __import__('sys').version.split()[0])" \
        | tee "$out/replica.txt"
    # XLA's own compile for a described H100 (its Triton included): fails on any illegal kernel.
    # Full logs in $out; each part's summary on the terminal, a failing part ends the step.
    "$venv/bin/python" scripts/count_gpu_launches.py --impls "$TARGET_IMPLS,pallas-one-pass,pallas-resident-unrolled" \
        --lengths 4096,16384 > "$out/launches.jsonl" 2> "$out/launches.log" || {
        tail -5 "$out/launches.log" >&2; exit 1; }
    cut -c1-110 "$out/launches.jsonl"
    JAX_PLATFORMS=cpu "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_pallas.py tests/test_transport.py \
        tests/test_accelerators.py tests/test_marginals.py tests/test_gpu_budget.py > "$out/pytest_kernels.txt" 2>&1 || {
        tail -15 "$out/pytest_kernels.txt" >&2; exit 1; }
    tail -1 "$out/pytest_kernels.txt" | tee -a "$out/replica.txt"
    JAX_PLATFORMS=cpu "$venv/bin/python" -m pytest -m gpu -q -p no:cacheprovider --co 2>&1 | tail -1 | tee -a "$out/replica.txt"
    # The scripts `issue11` and `train` run there, at a small size on this CPU (no timing):
    # each must finish, every benchmarked variant with status "ok"
    local cpu="env JAX_PLATFORMS=cpu $venv/bin/python"
    $cpu scripts/bench_transport.py --impls "$TARGET_IMPLS,ott" --lengths 256 --half-band 32 --repeats 1 --json \
        > "$out/bench_small.jsonl" 2> "$out/bench_small.log" \
        && $cpu -c 'import json, sys; rows = [json.loads(s) for s in open(sys.argv[1]) if s.startswith("{")]
bad = [r["impl"] for r in rows if r.get("status") != "ok"]
sys.exit(f"not ok: {bad}" if bad or not rows else None)' "$out/bench_small.jsonl" || {
        tail -5 "$out/bench_small.log" >&2; exit 1; }
    $cpu scripts/profile_transport.py --impls pallas-fused-tf32x3 --lengths 256 --half-band 32 --top 3 \
        --streaming-tiles 1 --score-groups 1,3 --out "$out/profile_small" > "$out/profile_small.jsonl" 2>&1 || {
        tail -5 "$out/profile_small.jsonl" >&2; exit 1; }
    $cpu scripts/bench_train.py --configs k2_eps1 --batch 2 --reps 1 --no-pad1024 --pairs-per-family 1 \
        --pfam "$out/no-pfam" > "$out/bench_train_small.jsonl" 2>&1 || { tail -5 "$out/bench_train_small.jsonl" >&2; exit 1; }
    echo "issue11's and train's scripts ran at L 256 (bench_transport, profile_transport) and on the fixtures (bench_train)" \
        | tee -a "$out/replica.txt"
}

# XLA GPU settings that cut the per-iteration launch and loop overhead of the Sinkhorn scans,
# tried one at a time by `flags` (each JSON line records its XLA_FLAGS): the XLA path loses
# to dense autodiff below L 8192 on the H100 with a few microseconds of work per kernel.
XLA_FLAG_SETS=(
    ""
    "--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL"
    "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
    "--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
)

# One part of a one-call step (issue11, spokes): stopped at its own limit, so that the call
# ends inside the lease and every finished part's output comes back; logged to $PART_LOG.
part() {  # seconds, output file, command...
    local limit=$1 file=$2
    shift 2
    echo "# $(date -u +%T) $* (limit ${limit}s)" | tee -a "$PART_LOG"
    timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$file" 2>&1 || echo "# exit $? (124: its limit)" | tee -a "$PART_LOG"
}

# issue11's parts: (seconds, log file, command). Each part is stopped at its limit, so the call
# (with the install, under 9.5 minutes) ends inside its own and every finished part's output
# comes back. L 16384 first (two of the three targets; ott-jax only there, where its target
# is); xla is left out (measured 2026-11-24; each configuration is a fresh process that
# compiles, ~30 s).
TARGET_IMPLS=reference,pallas-fused-tf32x3,pallas-fused,pallas-one-pass-tf32x3
issue11() {
    local log="$OUT_DIR/issue11_summary.txt"
    PART_LOG=$log
    # H200, 2026-11-29: 63 s, 42 s, the tests 127 s with 18 of the heaviest failing before their
    # compile (116 s for test_accelerators.py alone, fixed), and 8 s the profile; the spoke
    # benchmark at 16384 replaces a second profile (2026-11-30: ~15 s a configuration)
    part 100 bench_16384.txt python3 scripts/bench_transport.py --impls "$TARGET_IMPLS,ott" --lengths 16384 \
        --repeats 5 --json --mem-budget-gib 60 --timeout 100
    part 70 bench_4096.txt python3 scripts/bench_transport.py --impls "$TARGET_IMPLS" --lengths 4096 \
        --repeats 5 --json --timeout 60
    # ~174 tests, mostly Triton compiles (127 s on 2026-11-29, 160 s on 2026-11-30): 8 workers on the
    # 16 cores, sharing the GPU
    part 220 pytest_gpu.txt env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu -q -n 8 \
        -p no:cacheprovider --tb=short -rfE
    # the scores kernel as measured, then split over 5 diagonal groups (pallas_gpu.SCORE_GROUPS:
    # 2,560 programs for 512; not yet run on hardware): its "band_scores" lines side by side
    part 60 profile_fused.jsonl python3 scripts/profile_transport.py --impls pallas-fused \
        --lengths 16384 --half-band 1024 --top 30 --score-groups 1,5 --out "$OUT_DIR"
    # the shipped models' spoke dustbin at the largest size (the full set: `spokes`)
    part 60 bench_spoke_16384.txt python3 scripts/bench_transport.py --dustbin spoke \
        --impls reference,xla,pallas-fused --lengths 16384 --repeats 5 --json --mem-budget-gib 60 --timeout 60
    {   echo "## $(head -1 "$OUT_DIR/device.txt")"
        grep -h "^target" "$OUT_DIR"/bench_*.txt || echo "no targets measured"
        python3 - "$OUT_DIR/bench_16384.txt" "$OUT_DIR/bench_4096.txt" "$OUT_DIR/profile_fused.jsonl" \
            "$OUT_DIR/bench_spoke_16384.txt" <<'PY' || true
import json, os, sys
lines = lambda path: [json.loads(s) for s in open(path) if s.startswith("{")] if os.path.exists(path) else []
rows = lines(sys.argv[1]) + lines(sys.argv[2]) + [dict(r, impl=r["impl"] + " (spoke)") if "impl" in r else r
                                                  for r in lines(sys.argv[4])]
for r in rows:
    if "impl" in r:
        print(f"{r['L']:>6} {r['impl']:<24} {r['status']:<8} {r.get('fwd_bwd_ms') or 0:9.3f} ms  "
              f"grad_err {float('nan') if r.get('grad_err') is None else r['grad_err']:.1e}  {r.get('reason') or ''}"[:160])
for r in lines(sys.argv[3]):
    if "op" in r:
        print(f"  {r.get('ms', r.get('ms_per_call', 0)):8.3f} ms  {r['calls']:>4}x  tiles {r.get('streaming_tiles')}  "
              f"groups {r.get('score_groups')}  {r['op'][:80]}")
PY
        tail -1 "$OUT_DIR/pytest_gpu.txt" || true; } 2>&1 | tee -a "$log"
}

# The fused steps with dustbin spokes (the shipped models' dustbin: the kernels solve the
# dustbin lines too), one call (< 6 minutes): the compiled fused-step tests against float64
# (every dustbin mode) and the cold-score gradient test (one plan rounding on both walks), the benchmark with spokes against dense and the XLA path at three
# lengths (what impl="auto" takes there), and the per-kernel profile with spokes at L 16384
# (its trace comes back too: trace/*.xplane.pb)
spokes() {
    local log="$OUT_DIR/spokes_summary.txt"
    PART_LOG=$log
    part 90 pytest_gpu_spokes.txt env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu -q -n 4 \
        -p no:cacheprovider --tb=short -rfE -k "fused or auto_banded or cold_score"
    part 200 bench_spoke.txt python3 scripts/bench_transport.py --dustbin spoke \
        --impls reference,xla,pallas-fused,pallas-fused-tf32x3 --lengths 4096,8192,16384 --repeats 5 --json \
        --mem-budget-gib 60 --timeout 60
    part 45 profile_fused_spoke.jsonl python3 scripts/profile_transport.py --impls pallas-fused --lengths 16384 \
        --half-band 1024 --dustbin spoke --top 30 --out "$OUT_DIR"
    {   tail -1 "$OUT_DIR/pytest_gpu_spokes.txt" || true
        grep -h "^target\|crossover" "$OUT_DIR/bench_spoke.txt" || true
        python3 - "$OUT_DIR/bench_spoke.txt" "$OUT_DIR/profile_fused_spoke.jsonl" <<'PY' || true
import json, os, sys
lines = lambda path: [json.loads(s) for s in open(path) if s.startswith("{")] if os.path.exists(path) else []
for r in lines(sys.argv[1]):
    if "impl" in r:
        print(f"{r['L']:>6} {r['impl']:<24} {r['status']:<8} {r.get('fwd_bwd_ms') or 0:9.3f} ms  "
              f"grad_err {float('nan') if r.get('grad_err') is None else r['grad_err']:.1e}  {r.get('reason') or ''}"[:160])
for r in lines(sys.argv[2]):
    if r.get("op") == "(whole call)":
        print(f"whole call {r['ms_per_call']:.3f} ms, traced {r['traced_ms_per_call']:.3f}")
    elif "op" in r:
        print(f"  {r['ms']:8.3f} ms  {r['calls']:>4}x  {r['op'][:80]}")
PY
    } 2>&1 | tee -a "$log"
}

# What issue11's call leaves to run, in one call (under 7 minutes: parts 80 + 120 + 130 s, each
# killed 10 s past its limit, and the install), most wanted first, so that a lease that ends
# during the call loses the last: the compiled one-plan and cold-score tests (added after the
# last GPU run), k2_eps1's training throughput (XLA autotuning off, as the H100's figure of
# 2026-11-24 was measured: its compiles, 8 padded lengths, would fill the limit), and the
# spoke dustbin at L 4096 and 8192 beside dense and the XLA path (16384 is in issue11).
rest() {
    local log="$OUT_DIR/rest_summary.txt"
    PART_LOG=$log
    part 80 pytest_gpu_rest.txt env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu -q -n 4 \
        -p no:cacheprovider --tb=short -rfE -k "one_plan or cold_score" tests/test_pallas.py tests/test_accelerators.py
    part 120 bench_train.jsonl env XLA_FLAGS=--xla_gpu_autotune_level=0 python3 scripts/bench_train.py \
        --pfam .gpu/pfam --configs k2_eps1 --no-pad1024
    part 130 bench_spoke_4096_8192.txt python3 scripts/bench_transport.py --dustbin spoke \
        --impls reference,xla,pallas-fused --lengths 4096,8192 --repeats 5 --json --timeout 40
    {   tail -1 "$OUT_DIR/pytest_gpu_rest.txt" || true
        python3 -c 'import json, sys
for r in (json.loads(s) for s in open(sys.argv[1]) if s.startswith("{")):
    print(r.get("config"), "examples/s", r.get("examples_per_s"), "impl", r.get("impl_by_padded_len"))' \
            "$OUT_DIR/bench_train.jsonl" || true
        grep -h "^target\|crossover" "$OUT_DIR/bench_spoke_4096_8192.txt" || true
    } 2>&1 | tee -a "$log"
}

case "${1:-}" in
    fetch) fetch ;;
    replica) replica ;;
    issue11) install; issue11 ;;
    spokes) install; spokes ;;
    rest) install; rest ;;
    # Extra arguments go to pytest / the benchmark (e.g. a test file, --lengths 4096).
    tests) install  # preallocation off: with -n N each worker would take 75 % of the GPU (2026-11-30)
        XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu -q -p no:cacheprovider "${@:2}" 2>&1 \
            | tee "$OUT_DIR/pytest_gpu.txt" ;;
    targets) install  # issue 11's three targets in one run (ratios in the same run)
        python3 scripts/bench_transport.py \
            --impls reference,ott,xla,pallas-fused,pallas-one-pass,pallas-fused-tf32x3,pallas-one-pass-tf32x3 \
            --lengths 4096,16384 --repeats 5 --json --mem-budget-gib 60 "${@:2}" 2>&1 | tee "$OUT_DIR/bench_targets.jsonl" ;;
    resident) install  # the candidate for GPU_BANDED_IMPL, at every size
        python3 scripts/bench_transport.py --impls reference,xla,pallas-resident,pallas-resident-unrolled,pallas-fused,pallas-one-pass,pallas-fused-tf32x3,pallas-one-pass-tf32x3 \
            --lengths 1024,4096,8192,16384 \
            --repeats 5 --json --mem-budget-gib 40 "${@:2}" 2>&1 | tee "$OUT_DIR/bench_resident.jsonl" ;;
    transport) install
        python3 scripts/bench_transport.py --impls reference,xla,xla-branch-free,pallas,ott --mem-budget-gib 40 "${@:2}" 2>&1 \
            | tee "$OUT_DIR/bench_transport.txt" ;;
    tune) install
        python3 scripts/tune_triton.py "${@:2}" 2>&1 | tee "$OUT_DIR/tune_triton.jsonl" ;;
    profile) install  # default: the XLA path at 4096 and 8192 (W 256), where 4096 runs slower;
        # --impls xla,xla-branch-free profiles both solves
        python3 scripts/profile_transport.py --out "$OUT_DIR" "${@:2}" 2>&1 | tee "$OUT_DIR/profile_transport.jsonl" ;;
    flags) install  # default: L 1024 and 4096 (W 256), where the XLA path is launch-bound
        for flags in "${XLA_FLAG_SETS[@]}"; do
            echo "# XLA_FLAGS=$flags" >&2
            XLA_FLAGS="$flags" python3 scripts/bench_transport.py --impls reference,xla,xla-branch-free,xla-unrolled --json \
                --lengths 1024,4096 --timeout 240 "${@:2}" || echo "# failed: XLA_FLAGS=$flags" >&2
        done 2> >(tee "$OUT_DIR/bench_flags.txt" >&2) | tee "$OUT_DIR/bench_flags.jsonl" ;;
    train) install
        python3 scripts/bench_train.py --pfam .gpu/pfam "${@:2}" 2>&1 | tee "$OUT_DIR/bench_train.jsonl" ;;
    -h|--help) sed -n '2,/^set -euo/p' scripts/gpu_session.sh | sed '$d'; exit 0 ;;
    *) echo "usage: bash scripts/gpu_session.sh fetch | issue11 | rest | tests | targets | resident | transport | tune | profile | flags | spokes | train | replica" >&2; exit 2 ;;
esac
