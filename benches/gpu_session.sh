#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md ("Embedding training on a GPU", G7), run on a lent GPU
# machine in as few calls as its 10-minute limit allows:
#
#     bash benches/gpu_session.sh STEP...      (results and logs under $OUT, default ./gpu-out)
#     DEADLINE=580 BUNDLE=1 bash benches/gpu_session.sh STEP...   (one call's worth, one file back)
#
# Steps, in the order worth running them: env (the machine, and a disk profile the engines plan
# with), tests (the device-parity tests with CUDA present), tests-alone (the same in one process,
# kernels launched synchronously: for a test that crashes), embed-step (kernels and seconds of one
# chunk of the embedding step), embed-fb15k, embed-trace and gnn-trace (B1's run and G6's device
# run under torch's profiler: where each epoch's device idle time goes, and a Chrome trace),
# embed-bf16 (the same with bf16 tables, and the RMAT
# epoch out of core with them), embed-pbg (PyTorch-BigGraph's GPU trainer beside
# Strata's at B1's settings), gnn-path (the GNN device
# data path alone on G6's graph, 60 batches an epoch: its speed and its per-batch host cost),
# gnn-g6, embed-rmat-resident, embed-rmat-ooc, embed-rmat-bf16 (both RMAT runs with bf16
# tables), embed-rmat-lean (both with bf16 tables and a row-wise Adagrad, two epochs),
# gnn-big-prepare, gnn-big, recipes (the ComplEx recipes on FB15k-237 and WN18RR on the GPU),
# recipes-fb260 (the FB15k-237 one for the 2-core run's 260 epochs, no early stop),
# recipes-tf32 (WN18RR's 1vsAll and KvsAll recipes with TF32 training products), recipes-n3
# (the ComplEx-N3 recipes), per-edge (transe-fb15k237 with shared negatives and with each
# edge's own). Each step runs
# under its own time limit (seconds, STEP_LIMIT_<step> overrides) and a failed step does not
# stop the next.
#
# The extension (abi3) and the datasets come from the development machine in .devcarry/
# (`_native.abi3.so`, `datasets.tgz`: FB15k-237, WN18RR and Planetoid; `bash benches/gpu_prepare.sh`
# makes it, and each call carries it): the machine has no Rust toolchain and no registry.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-/tmp/strata-gpu}
mkdir -p "$OUT" "$WORK"
export OUT WORK
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/benches${PYTHONPATH:+:$PYTHONPATH}
# Renamed into place: a process that has the old file mapped keeps it (a copy over it would not).
if [ -f .devcarry/_native.abi3.so ] && ! cmp -s .devcarry/_native.abi3.so python/strata/_native.abi3.so; then
    cp .devcarry/_native.abi3.so python/strata/.native.tmp && mv -f python/strata/.native.tmp python/strata/_native.abi3.so
fi
# PyG's sampler backend (torch-sparse, torch-scatter; benches/gpu_pyg_ext.sh), when carried.
if [ -d .devcarry/pyg ]; then export PYTHONPATH=$PYTHONPATH:$PWD/.devcarry/pyg; fi
# kvikio (GPUDirect Storage), when carried: the GNN device path reads its misses through it
# where cuFile works there.
if [ -d .devcarry/kvikio ]; then export PYTHONPATH=$PYTHONPATH:$PWD/.devcarry/kvikio; fi
# Each dataset that the machine lacks (a warm machine keeps those of an earlier call).
for d in fb15k-237 wn18rr planetoid; do
    if [ -f .devcarry/datasets.tgz ] && [ ! -d "../shared/datasets/$d" ]; then
        mkdir -p ../shared/datasets && tar -xzf .devcarry/datasets.tgz -C ../shared/datasets "$d"
    fi
done

# Seconds per step; measured on an H100 machine (2026-11-25): env 22, tests 30, embed-fb15k 111,
# embed-rmat-resident 140; embed-rmat-ooc did not finish in 300. On an H200 (2026-11-26): tests 31,
# embed-step 10, embed-fb15k 72, gnn-g6 75 (its PyG part skipped); later: tests 29, embed-step 7,
# gnn-path 12, recipes 189 (both ComplEx recipes to their ends, 107 s of training each at most).
# gnn-g6 now trains the device path twice (--step auto and eager) and PyG's run when its
# backend is carried: its limit allows for both. On an H200 (2026-11-27): tests 65, embed-step
# 14, gnn-path 15, embed-fb15k 98, gnn-g6 112 (PyG's run included), embed-pbg 116 (50 of them
# building PBG's helpers), embed-rmat-resident 106 with its store made by an earlier call (the
# store takes about 45 s more); embed-rmat-ooc needs about 180 s past its 70 s of set-up. On an
# H200 (2026-11-27, later): env 19, embed-step 15, embed-fb15k 120, embed-rmat-lean 155 with
# its store made by an earlier call (the store about 45 s more), tests 60. On an H200
# (2026-11-28): tests 60 to 77, gnn-g6 140, embed-trace 14, gnn-trace 25, embed-fb15k 86,
# embed-rmat-lean 182 with its store made in the call, gnn-path 11, embed-step 20.
# On an H200 (2026-11-29): env 25, recipes-fb260 66, gnn-g6 145 (PyG's part skipped),
# embed-rmat-lean 224 with its store made in the call, tests 63, gnn-big-prepare 128, gnn-big 134.
declare -A LIMIT=([env]=60 [tests]=240 [tests-alone]=240 [embed-step]=120 [embed-fb15k]=150 [embed-trace]=150 [gnn-trace]=200 [embed-bf16]=400 [embed-pbg]=240 [gnn-path]=150 [gnn-g6]=300 [embed-rmat-resident]=200
    [embed-rmat-ooc]=540 [embed-rmat-bf16]=540 [embed-rmat-lean]=560 [gnn-big-prepare]=560 [gnn-big]=400 [recipes]=540 [recipes-fb260]=240 [recipes-tf32]=540
    [recipes-n3]=560 [per-edge]=240)

step_env() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, strata; print('torch', torch.__version__, torch.cuda.get_device_name())"
    python3 -m strata bench-disk --dir "$WORK" --size 4G --queue-depths 1 32 128 --seconds 2 --json-summary
    python3 benches/gds_probe.py --dir "$WORK"
}
# The device-parity tests; TESTS names a subset. Exported: each step runs in its own shell.
export DEVICE_TESTS="tests/test_embed_device.py tests/test_device_rng.py tests/test_gnn_device_sampler.py
    tests/test_gnn_device_path.py tests/test_gnn_device_reads.py tests/test_embed_device_eval.py
    tests/test_embed_device_step.py tests/test_triton_kernels.py tests/test_gnn_step.py"
# Only their cuda cases: the CPU twins are CI's, and some cannot run on the GPU machine's stack
# (Triton 3.6's interpreter takes a loop's runtime bound as a 1-element array, which the
# machine's NumPy refuses to convert to an int; Triton 3.9, CI's, squeezes it first).
# A worker aborted with no message under -n 8 on an H200 (2026-11-27): pytest's default capture
# (--capture=fd) sends a test's fd 2 to a temporary file that dies with the worker, so whatever
# native code said before the abort (a Rust panic, C++'s "terminate called after throwing",
# glibc's heap check) was lost. --capture=sys leaves fd 2 to the worker's own stderr, which
# reaches this step's log. LIBC_FATAL_STDERR_: glibc's fatal messages on stderr, not on a tty the
# workers lack; TORCH_SHOW_CPP_STACKTRACES and RUST_BACKTRACE: where a C++ error or a panic
# came from.
step_tests() {
    LIBC_FATAL_STDERR_=1 TORCH_SHOW_CPP_STACKTRACES=1 RUST_BACKTRACE=1 python3 -m pytest -q --capture=sys \
        --maxfail 10 -n 8 -p no:cacheprovider -k "not cpu" ${TESTS:-$DEVICE_TESTS}
}
# The same one at a time in one process, every native message shown: for a test that crashes
# its worker (TESTS names it, as pytest's node id). Kernels launch synchronously unless
# BLOCKING=0 (a crash that needs other tests' state and asynchronous launches to show).
step_tests-alone() {
    CUDA_LAUNCH_BLOCKING=${BLOCKING:-1} RUST_BACKTRACE=1 python3 -X faulthandler -m pytest -q -s -p no:xdist \
        -p no:cacheprovider -k "not cpu" ${TESTS:-$DEVICE_TESTS}
}
# Then B1's chunk in a piece of B1's length (273 chunks, the whole epoch's): a piece's own host
# work, shared by 33 chunks in the first figures, is then spread as an epoch spreads it.
step_embed-step() {
    python3 benches/bench_embed_step.py --device cuda --profile >"$OUT/embed-step.json" &&
        python3 benches/show_profile.py "$OUT/embed-step.json" &&
        python3 benches/bench_embed_step.py --device cuda --case b1 --chunks 272 >"$OUT/embed-step-b1-piece.json"
}
# The run.json and timeline.jsonl (each epoch's compute, wait and I/O intervals on the host) of
# the runs named, from $WORK/embed into $OUT: where a device run's host time goes.
keep_runs() {
    local r
    for r in "$@"; do
        mkdir -p "$OUT/$r" && cp "$WORK/embed/$r/run.json" "$WORK/embed/$r/timeline.jsonl" "$OUT/$r/"
    done
}
step_embed-fb15k() {
    python3 benches/bench_embed_device.py --part fb15k --work "$WORK/embed" --out "$OUT/embed-device.json" &&
        keep_runs run-fb15k-device run-fb15k-back
}
# bf16 tables on the device: B1's settings (seconds and MRR against the float32 runs of
# embed-fb15k), then the RMAT epoch out of core, half the bytes a partition moves.
# B1's run (five epochs, validation off) and G6's device run (three epochs) traced in-process:
# the summary in the log and the JSON, the Chrome traces (gzipped) beside them.
step_embed-trace() {
    python3 benches/bench_embed_device.py --part fb15k-trace --work "$WORK/embed" --out "$OUT/embed-trace.json"
}
step_gnn-trace() {
    python3 benches/bench_gnn_device.py --only trace --work "$WORK/gnn" --out "$OUT/gnn-trace.json"
}
step_embed-bf16() {
    python3 benches/bench_embed_device.py --part fb15k --part rmat-prepare --part rmat-ooc --table-dtype bf16 \
        --work "$WORK/embed" --out "$OUT/embed-device.json"
}
# PyTorch-BigGraph's GPU trainer against `--device cuda` at B1's settings (PBG's source and the
# pkg_resources it imports carried in .devcarry/pbg and .devcarry/pbg-deps; its C++ helpers are
# built there first, about a minute on the first call).
step_embed-pbg() {
    rm -rf "$WORK/pbg-src" && cp -r .devcarry/pbg "$WORK/pbg-src" &&
        python3 benches/bench_embed_pbg.py --pbg "$WORK/pbg-src" --pbg-path "$PWD/.devcarry/pbg-deps" --device cuda \
            --work "$WORK/pbg" --out "$OUT/embed-pbg.json"
}
step_gnn-path() {
    python3 benches/bench_gnn_device.py --only path --max-batches 60 --work "$WORK/gnn" --out "$OUT/gnn-path.json" &&
        python3 benches/show_profile.py "$OUT/gnn-path.json"
}
step_gnn-g6() {
    python3 benches/bench_gnn_device.py --only g6,reads,pyg --work "$WORK/gnn" --out "$OUT/gnn-g6.json"
}
# RMAT scale 24 (prepared in about 45 s on 16 cores) with the table resident, then out of core.
step_embed-rmat-resident() {
    python3 benches/bench_embed_device.py --part rmat-prepare --part rmat-resident \
        --work "$WORK/embed" --out "$OUT/embed-device.json"
}
# The RMAT pair with bf16 tables: half the bytes a swap moves, which by Legend's Theorem 3 is
# what a disk of about 1 GB/s (read and write together, as the H200 machine's measured in the
# float32 out-of-core run) needs to hide the swaps behind the compute.
step_embed-rmat-bf16() {
    python3 benches/bench_embed_device.py --part rmat-prepare --part rmat-resident --part rmat-ooc \
        --table-dtype bf16 --work "$WORK/embed" --out "$OUT/embed-device.json"
}
# The RMAT pair with bf16 tables and one Adagrad accumulator a node (about a quarter of the
# float32 bytes a swap moves), two epochs each: the second out-of-core epoch starts in the state
# the first ended in (no fill), the steady state the goals compare. The out-of-core epoch runs
# twice: its partitions kept in host memory (swaps between host and device memory), and every
# load from the SSD (Legend's own setting).
step_embed-rmat-lean() {
    python3 benches/bench_embed_device.py --part rmat-prepare --part rmat-resident --part rmat-ooc \
        --table-dtype bf16 --optimizer adagrad_row --epochs 2 --work "$WORK/embed" --out "$OUT/embed-device.json" &&
        keep_runs run-rmat-resident run-rmat-ooc run-rmat-ooc-ssd
}
step_embed-rmat-ooc() {
    python3 benches/bench_embed_device.py --part rmat-prepare --part rmat-ooc \
        --work "$WORK/embed" --out "$OUT/embed-device.json"
}
# The big graph: 20M nodes by default (20 GB of features; BIG_NODES smaller keeps the features 4x
# the host budget in a session too short to write 20 GB twice on the machine's disk).
# The store takes about 45 GB while it is made, and an earlier step's RMAT store and runs about
# 20 GB of the machine's 64: those go first when the disk is short (a later RMAT step makes
# its store again).
step_gnn-big-prepare() {
    local free_gb
    free_gb=$(df --output=avail -BG "$WORK" | tail -1 | tr -dc 0-9)
    if [ "$free_gb" -lt 50 ]; then
        echo "gnn-big-prepare: ${free_gb} GB free; removing the RMAT store and runs of $WORK/embed"
        rm -rf "$WORK"/embed/rmat-* "$WORK"/embed/run-rmat-*
    fi
    python3 benches/bench_gnn_device.py --only big --prepare --big-nodes "${BIG_NODES:-20000000}" --work "$WORK/gnn"
}
step_gnn-big() {
    python3 benches/bench_gnn_device.py --only big,big-pyg --big-nodes "${BIG_NODES:-20000000}" --work "$WORK/gnn" \
        --out "$OUT/gnn-big.json"
}
# bench_recipes.py on the GPU: recipes $2 (comma-separated) with training products $3 (float32
# or tf32), each for $4 seconds, its best checkpoint tested; recipes.json becomes $OUT/$1.json.
recipes_on_gpu() {
    python3 benches/bench_recipes.py --device cuda --device-matmul "$3" --only "$2" \
        --max-seconds "$4" --out "$WORK/$1" --no-doc &&
        cp "$WORK/$1/recipes.json" "$OUT/$1.json"
}
# The two ComplEx recipes of docs/benchmarks.md's recipe table on the GPU (negative sampling on
# FB15k-237, 1vsAll on WN18RR), or those RECIPES names, each for RECIPE_SECONDS (default 180):
# recipes.json holds seconds an epoch and the MRR reached.
step_recipes() {
    recipes_on_gpu recipes "${RECIPES:-complex-fb15k237,complex-wn18rr}" float32 "${RECIPE_SECONDS:-180}"
}
# complex-fb15k237 for the 260 epochs the 2-core run of the recipe table trained (its time limit
# ended it there, test MRR 0.3456), early stopping off: the GPU's second session's run of the
# recipe as shipped stopped early at 250 on a tie at the plateau (test 0.3433), so this is the
# side by side at equal epochs.
step_recipes-fb260() {
    python3 benches/bench_recipes.py --device cuda --only complex-fb15k237 --max-epochs 260 \
        --early-stopping-patience 0 --out "$WORK/recipes-fb260" --no-doc &&
        cp "$WORK/recipes-fb260/recipes.json" "$OUT/recipes-fb260.json"
}
# The same for the WN18RR recipes whose products are largest (b x 40,943 x dim a side), with
# device_matmul = tf32: seconds an epoch and MRR against the float32 run of the step above.
step_recipes-tf32() {
    recipes_on_gpu recipes-tf32 complex-wn18rr,distmult-wn18rr tf32 "${RECIPE_SECONDS:-180}"
}
# Lacroix et al.'s ComplEx-N3 recipes (1vsAll at 2000 and 1000 reals: the recipe table's highest
# published figures), each for RECIPE_SECONDS (default 240), with MATMUL's training products
# (float32 unless MATMUL=tf32).
step_recipes-n3() {
    recipes_on_gpu recipes-n3 complex-n3-fb15k237,complex-n3-wn18rr "${MATMUL:-float32}" "${RECIPE_SECONDS:-240}"
}
# transe-fb15k237 for 10 epochs with the chunk's shared negatives, then with each edge's own
# (PyKEEN's and LibKGE's sampling): seconds an epoch and the validation MRR of each, beside the
# 2-core figures of docs/benchmarks.md ("PyKEEN side by side"); the runs' records in $OUT.
step_per-edge() {
    local store="$WORK/fb15k-237.strata"
    [ -d "$store" ] || python3 -m strata convert ../shared/datasets/fb15k-237 --relations --out "$store" -q ||
        return
    for mode in shared no-shared; do
        python3 -m strata embed train "$store" --config examples/recipes/transe-fb15k237.toml --device cuda \
            --epochs 10 --eval-every 10 --run-dir "$WORK/per-edge-$mode" --fresh "--$mode-negatives" -q &&
            cp "$WORK/per-edge-$mode/run.json" "$OUT/per-edge-$mode.json" || return
    done
}

for step in "$@"; do
    if ! declare -F "step_$step" >/dev/null; then
        echo "gpu_session.sh: unknown step $step (steps: ${!LIMIT[*]})" >&2
        exit 2
    fi
done
# DEADLINE (seconds from now): each step's limit is cut to what is left of it, and a step with
# under 20 s left is skipped, so one call of the device tool (at most 600 s) never runs over.
# BUNDLE=1: $OUT's files are packed into one $OUT/results.tgz at the end (the tool brings back
# a few files only).
for step in "$@"; do
    var=STEP_LIMIT_${step//-/_}
    limit=${!var:-${LIMIT[$step]:-300}}
    if [ -n "${DEADLINE:-}" ]; then
        left=$((DEADLINE - SECONDS - 5))
        if [ "$left" -lt 20 ]; then
            echo "=== $step: skipped, ${left} s left of DEADLINE"
            continue
        fi
        limit=$((limit < left ? limit : left))
    fi
    echo "=== $step (limit ${limit} s) $(date -u +%T)"
    start=$SECONDS t0=$(date +%s)
    # Every function: a step may call the helpers (recipes_on_gpu, keep_runs).
    timeout --signal=INT --kill-after=10 "$limit" bash -c "$(declare -f); step_$step" \
        >"$OUT/$step.log" 2>&1
    rc=$?
    # The runs' own logs (benches write each run's stderr as it goes), for a run cut off.
    find "$WORK" -name '*.log' -newermt "@$t0" -print0 |
        while IFS= read -r -d '' f; do echo "--- $f"; tail -n 15 "$f"; done >>"$OUT/$step.log"
    tail -n 25 "$OUT/$step.log"
    echo "=== $step: exit $rc after $((SECONDS - start)) s"
done
if [ "${BUNDLE:-0}" = 1 ]; then
    tar czf "$WORK/results.tgz" -C "$OUT" --exclude results.tgz . && find "$OUT" -mindepth 1 -delete &&
        mv "$WORK/results.tgz" "$OUT/"
fi
