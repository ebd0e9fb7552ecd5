#!/usr/bin/env bash
# vLLM on a GPU host that cannot reach a package index and takes uploads of limited size (an air-gapped node, a
# scheduler that copies one folder per job): the wheels are fetched here, cut into parts, carried a part at a time into a
# staging folder on the host, and put together and installed there.
#
#   bash scripts/gpu_vllm.sh prepare [MIB]   here, with an index: the wheels of scripts/gpu_vllm_wheels.txt into
#                                            .vllm/wheels/ (or copied from the wheelhouse $VLLM_WHEELS_FROM), one tar
#                                            of them cut into .vllm/part-<k>/ folders of at most MIB MiB (default 50)
#                                            and .vllm/MANIFEST (each part's sha256)
#   bash scripts/gpu_vllm.sh stage K         on the host, once for each part, in any order and in separate uploads:
#                                            .vllm/part-K/ (uploaded beside .vllm/MANIFEST) checked and copied into
#                                            $VLLM_STAGE (default /tmp/vllm-stage), which outlives the upload
#   bash scripts/gpu_vllm.sh install         on the host: every part staged and intact, the tar put together, its
#                                            wheels installed with --no-deps into $VLLM_SITE (default /tmp/vllm-site)
#   bash scripts/gpu_vllm.sh check           on the host, after install, in about 5 minutes ($VLLM_CHECK_SECONDS,
#                                            default 280): 1. vLLM and torch imported, the CUDA device; 2. the vLLM
#                                            tests of tests/engines on CUDA (weight sync, LoRA, sleep mode, fit,
#                                            evaluate); 3. a fit of conf/frozenlake.yaml on vLLM and its evaluation;
#                                            4. scripts/bench_step.py on the HF engine and on vLLM. A table (step,
#                                            result, seconds, key figures) ends it; $OUT (default: out/ in the work
#                                            folder, $VLLM_CHECK_DIR or a new temporary one) gets summary.md,
#                                            check.log (every step's last lines), results.tsv and the fit's, the
#                                            evaluation's and the benchmarks' JSON
#
# The wheels are for CPython 3.12 on manylinux x86_64 and an image that already holds torch 2.11 with CUDA 13 (the
# torch vLLM 0.25 pins), lightning, torchmetrics and the other packages torch's CUDA images ship. Installing with
# --no-deps keeps that torch: vLLM's declared requirements name many packages its offline `LLM` path never imports.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.vllm
STAGE=${VLLM_STAGE:-/tmp/vllm-stage}
SITE=${VLLM_SITE:-/tmp/vllm-site}
PY=${PYTHON:-python3}

die() {
    echo "gpu_vllm: $*" >&2
    exit 2
}

# the wheel of REQUIREMENT built here from its source distribution into $DIR/wheels, kept only when it is pure Python
# (*-none-any): a compiled one would be for this machine's Python and platform, not the host's
pure_wheel() {
    local built status=0
    built=$(mktemp -d)
    $PY -m pip wheel -q --no-deps -w "$built" "$1" && compgen -G "$built/*-none-any.whl" >/dev/null &&
        mv "$built"/*-none-any.whl "$DIR/wheels/" || status=1
    rm -rf "$built"
    return $status
}

prepare() {
    local mib=${1:-50}
    [[ "$mib" =~ ^[1-9][0-9]*$ ]] || die "prepare MIB: '$mib' is not a whole number of MiB above 0"
    rm -rf "$DIR" && mkdir -p "$DIR/wheels"
    if [ -n "${VLLM_WHEELS_FROM:-}" ]; then
        [ -d "$VLLM_WHEELS_FROM" ] || die "VLLM_WHEELS_FROM=$VLLM_WHEELS_FROM: no such folder"
        cp "$VLLM_WHEELS_FROM"/*.whl "$DIR/wheels/"
    else
        local platforms=() n
        for n in 5 17 24 26 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
        grep -v -e '^#' -e '^\s*$' scripts/gpu_vllm_wheels.txt | while read -r requirement; do
            $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d "$DIR/wheels" "$requirement" ||
                # published only as source (antlr4 4.9.3, which hydra-core pins): its pure-Python wheel built here
                pure_wheel "$requirement" ||
                die "pip could neither download $requirement for CPython 3.12 manylinux x86_64 nor build it pure-Python"
        done
    fi
    tar -C "$DIR" -cf - wheels | split -d -a 2 -b "${mib}M" - "$DIR/part."
    rm -rf "$DIR/wheels"
    local part k
    for part in "$DIR"/part.*; do
        k=$((10#${part##*.}))
        mkdir -p "$DIR/part-$k" && mv "$part" "$DIR/part-$k/part"
        echo "$k $(sha256sum "$DIR/part-$k/part" | cut -d' ' -f1)" >>"$DIR/MANIFEST"
    done
    echo "gpu_vllm: $(wc -l <"$DIR/MANIFEST") parts of at most $mib MiB in $DIR/part-<k>/; on the host run, part by part:"
    echo "  bash scripts/gpu_vllm.sh stage <k>      (with $DIR/MANIFEST and $DIR/part-<k>/ uploaded)"
    echo "then: bash scripts/gpu_vllm.sh install && bash scripts/gpu_vllm.sh check"
}

# the expected sha256 of part K, from the MANIFEST
expected() {
    [ -f "$DIR/MANIFEST" ] || die "$DIR/MANIFEST is missing: upload it with every part (prepare writes it)"
    awk -v k="$1" '$1 == k { print $2 }' "$DIR/MANIFEST"
}

stage() {
    local k=${1:-}
    [[ "$k" =~ ^[0-9]+$ ]] || die "stage K: give the number of a part (0, 1, ...), not '$k'"
    local want
    want=$(expected "$k")
    [ -n "$want" ] || die "stage $k: the MANIFEST has parts $(cut -d' ' -f1 "$DIR/MANIFEST" | tr '\n' ' ')and no $k"
    [ -f "$DIR/part-$k/part" ] || die "stage $k: $DIR/part-$k/part is not here; upload that folder with this command"
    [ "$(sha256sum "$DIR/part-$k/part" | cut -d' ' -f1)" = "$want" ] || die "stage $k: the part differs from the MANIFEST"
    mkdir -p "$STAGE" && cp "$DIR/part-$k/part" "$STAGE/part.$(printf %02d "$k")" && cp "$DIR/MANIFEST" "$STAGE/"
    echo "gpu_vllm: part $k staged; $STAGE holds $(ls "$STAGE"/part.* | wc -l) of $(wc -l <"$DIR/MANIFEST") parts"
}

install_wheels() {
    [ -f "$STAGE/MANIFEST" ] || die "nothing staged in $STAGE: run 'stage K' for every part first"
    local k sum missing=()
    while read -r k sum; do
        local part
        part="$STAGE/part.$(printf %02d "$k")"
        if [ ! -f "$part" ] || [ "$(sha256sum "$part" | cut -d' ' -f1)" != "$sum" ]; then missing+=("$k"); fi
    done <"$STAGE/MANIFEST"
    [ ${#missing[@]} -eq 0 ] || die "parts ${missing[*]} are missing or damaged in $STAGE: stage them again"
    rm -rf "$STAGE/wheels" && cat "$STAGE"/part.* | tar -C "$STAGE" -xf -
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$STAGE"/wheels/*.whl
    echo "gpu_vllm: $(ls "$STAGE"/wheels/*.whl | wc -l) wheels installed in $SITE; use them with"
    echo "  export PYTHONPATH=$SITE:\$PWD/src"
}

# --- check: what someone moving a vLLM setup to ragen_lit verifies first, on one GPU, in one command of ~5 minutes ---
# Every step runs whatever happened to the others, under `timeout` within its own limit and the check's deadline
# ($VLLM_CHECK_SECONDS after the start, default 280); it logs to $WORK/logs/, and the table gets its result, seconds and
# key figures (scripts/gpu_vllm_report.py). After step 1, steps 2-4 run side by side in four lanes: their GPU memory
# adds up to about 80 GiB (every vLLM engine gets a fixed KV cache, so that none profiles the free memory the others
# change meanwhile), and the benchmarks are timed while the other lanes run: their figures are indicative, not a
# benchmark of an idle GPU.

# `step ORDER NAME LIMIT KIND FUNCTION [ARG...]`: FUNCTION (exported) under `timeout`, for at most LIMIT seconds and
# never past the deadline; appends "ORDER<TAB>NAME<TAB>result<TAB>seconds<TAB>key figures" to $WORK/results.tsv
step() {
    local order=$1 name=$2 limit=$3 kind=$4
    shift 4
    local log="$WORK/logs/$order.log" left=$((DEADLINE - SECONDS)) start=$SECONDS status result figures
    ((left < limit)) && limit=$left
    if ((limit < 5)); then
        printf '%s\t%s\t%s\t%s\t%s\n' "$order" "$name" "skipped: no time left" 0 "" >>"$WORK/results.tsv"
        return
    fi
    echo "gpu_vllm: $(date +%T) start: $name (at most $limit s)"
    timeout -k 5 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
    status=$?
    case $status in
    0) result=pass ;;
    124 | 137) result="TIMEOUT after $limit s" ;;
    *) result="FAIL (exit $status)" ;;
    esac
    figures=$(timeout 30 $PY scripts/gpu_vllm_report.py figures "$kind" "$log" "$WORK" 2>&1 | tail -1 | tr '\t' ' ')
    printf '%s\t%s\t%s\t%s\t%s\n' "$order" "$name" "$result" $((SECONDS - start)) "$figures" >>"$WORK/results.tsv"
    echo "gpu_vllm: $(date +%T) $result: $name"
}

check_import() {
    $PY - <<'PYTHON'
import importlib.util

import torch
import transformers
import vllm

free, total = torch.cuda.mem_get_info()
print(
    f"import: vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
    f"{transformers.__version__}; {torch.cuda.get_device_name(0)}, {free / 2**30:.0f} of {total / 2**30:.0f} GiB free"
)
needed = ("pytest", "hypothesis", "peft", "lightning", "mlflow", "gymnasium", "hydra", "omegaconf")
print("missing: " + ", ".join(name for name in needed if importlib.util.find_spec(name) is None))
# what starting an offline vllm.LLM imports beyond `import vllm` (its engine, structured output, the sampler's
# flashinfer check): a wheel missing there fails here in seconds instead of in every later step
for module in (
    "vllm.entrypoints.llm",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.v1.attention.backends.flashinfer",
):
    importlib.import_module(module)
PYTHON
}

# the vLLM tests of one file of tests/engines, on CUDA
check_tests() {
    RAGEN_LIT_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -m vllm -rA --basetemp="$WORK/pytest-${1%.py}" \
        "tests/engines/$1"
}

# the shipped FrozenLake recipe on vLLM for $FIT_ITERATIONS iterations (validated every 10, and at the start and end);
# vLLM gets a fixed KV cache (2 GiB: 1,024 validation episodes of the tiny model)
check_fit() {
    $PY -m ragen_lit fit --config conf/frozenlake.yaml rollout.engine=vllm "trainer.iterations=$FIT_ITERATIONS" \
        "logging.output_dir=$WORK/fit" logging.run_name=vllm-fit rollout.gpu_memory_utilization=0.1 \
        rollout.vllm_args.kv_cache_memory_bytes=$((2 << 30))
}

# the fit's run replayed on vLLM (its newest checkpoint; the episodes, seeds and temperature of its validation)
check_evaluate() {
    local run
    run=$(ls -d "$WORK"/fit/vllm-fit*/ 2>/dev/null | head -1)
    [ -n "$run" ] || { echo "no run folder in $WORK/fit: the fit did not start"; return 1; }
    $PY -m ragen_lit evaluate --model "$run" rollout.engine=vllm --out "$WORK/evaluate.json"
}

# scripts/bench_step.py at its defaults (0.5B shape, PPO, 128 episodes of 5 turns), the pipeline only, 3 iterations
# without the diagnostics, on ENGINE: hf, or vllm (a fixed KV cache of 8 GiB, ample for 128 sequences of 2,048 tokens)
check_bench() {
    local args=()
    [ "$1" = vllm ] && args=(--set rollout.engine=vllm rollout.gpu_memory_utilization=0.1
        "rollout.vllm_args.kv_cache_memory_bytes=$((8 << 30))")
    $PY scripts/bench_step.py --pipeline-only --no-diagnostics --iterations 3 --out "$WORK/bench_$1.json" "${args[@]}"
}

check() {
    set +e
    if [ -n "${VLLM_CHECK_DIR:-}" ]; then
        WORK=$VLLM_CHECK_DIR
        [ ! -e "$WORK" ] || [ -z "$(ls -A "$WORK")" ] || die "VLLM_CHECK_DIR=$WORK is not empty: name a new folder"
    else
        WORK=$(mktemp -d -t vllm-check.XXXX)
    fi
    local out=${OUT:-$WORK/out} allowed=${VLLM_CHECK_SECONDS:-280}
    mkdir -p "$WORK/logs" "$out"
    : >"$WORK/results.tsv"
    if [ ! -d "$SITE/vllm" ]; then
        echo "gpu_vllm check: no vLLM in $SITE: run 'install' first" | tee "$out/summary.md" >&2
        exit 2
    fi
    # one host, no network: vLLM's own rendezvous on the loopback (it otherwise routes towards a public address to
    # find this host's) and no usage reports
    export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
        PYTHONUNBUFFERED=1 VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    export PY WORK FIT_ITERATIONS=${VLLM_CHECK_FIT_ITERATIONS:-20}
    export -f check_import check_tests check_fit check_evaluate check_bench
    DEADLINE=$((SECONDS + allowed))
    local commit peak="" sampler="" failed log order name lanes=()
    commit=${RAGEN_LIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    echo "gpu_vllm: check of commit $commit, logs in $WORK, results in $out"
    if command -v nvidia-smi >/dev/null 2>&1; then
        # the GPU's memory in use by all processes together, every 2 s: the peak the lanes reached
        (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; sleep 2; done) \
            >"$WORK/gpu_memory.txt" 2>/dev/null &
        sampler=$!
    fi

    step 1 "1. import vllm, torch; the CUDA device" 60 import check_import
    step 2.1 "2. vLLM tests on CUDA: weight sync, LoRA, sleep/wake" 200 pytest check_tests test_vllm_sync.py &
    lanes+=($!)
    step 2.2 "2. vLLM tests on CUDA: fit and evaluate" 220 pytest check_tests test_vllm_fit.py &
    lanes+=($!)
    {
        step 3.1 "3. fit conf/frozenlake.yaml rollout.engine=vllm, $FIT_ITERATIONS iterations" 190 fit check_fit
        step 3.2 "3. evaluate that run, rollout.engine=vllm" 70 evaluate check_evaluate
    } &
    lanes+=($!)
    {
        # vLLM first: the HF engine's step has published figures to fall back on (docs/PERFORMANCE.md)
        step 4.2 "4. bench_step.py, vLLM engine" 150 bench-vllm check_bench vllm
        step 4.1 "4. bench_step.py, HF engine" 130 bench-hf check_bench hf
    } &
    lanes+=($!)
    wait "${lanes[@]}"
    [ -z "$sampler" ] || kill "$sampler" 2>/dev/null

    [ -s "$WORK/gpu_memory.txt" ] && peak=$(grep -E '^[0-9]+$' "$WORK/gpu_memory.txt" | sort -n | tail -1)
    {
        echo "vLLM check of commit $commit, $(date -u +%FT%TZ): $((SECONDS - DEADLINE + allowed)) s (deadline" \
            "$allowed s)${peak:+; peak GPU memory in use $((peak / 1024)) GiB (nvidia-smi, all processes)}"
        echo
        $PY scripts/gpu_vllm_report.py table "$WORK/results.tsv" || cat "$WORK/results.tsv"
    } >"$out/summary.md"
    # every step's log, its last lines (a traceback, pytest's summary and the figures come at the end)
    for log in $(ls "$WORK"/logs/*.log 2>/dev/null | sort -V); do
        order=$(basename "$log" .log)
        name=$(awk -F'\t' -v o="$order" '$1 == o { print $2 ": " $3 }' "$WORK/results.tsv")
        echo "===== $name; the last ${VLLM_CHECK_LOG_LINES:-150} lines of its log ====="
        tail -n "${VLLM_CHECK_LOG_LINES:-150}" "$log" | cut -c1-400
    done >"$out/check.log"
    cp "$WORK/results.tsv" "$out/results.tsv"
    $PY scripts/gpu_vllm_report.py collect "$WORK" "$out"
    echo
    cat "$out/summary.md"
    failed=$(awk -F'\t' '$3 != "pass"' "$WORK/results.tsv" | wc -l)
    echo
    echo "gpu_vllm: $failed of $(wc -l <"$WORK/results.tsv") steps did not pass; logs in $WORK, results in $out"
    [ "$failed" -eq 0 ]
}

case "${1:-}" in
prepare) prepare "${2:-}" ;;
stage) stage "${2:-}" ;;
install) install_wheels ;;
check) check ;;
*) die "give one of: prepare [MIB], stage K, install, check (not '${1:-}')" ;;
esac
