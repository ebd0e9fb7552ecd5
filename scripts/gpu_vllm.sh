#!/usr/bin/env bash
# vLLM on a GPU host that cannot reach a package index and takes uploads of limited size (an air-gapped node, a lease
# that copies one folder per command): the wheels are fetched here, cut into parts, carried a part at a time into a
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
#   bash scripts/gpu_vllm.sh check           on the host, after install: vLLM imported with the host's torch and CUDA,
#                                            then a short fit and an evaluation with rollout.engine=vllm
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

check() {
    [ -d "$SITE/vllm" ] || die "no vLLM in $SITE: run 'install' first"
    export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    $PY -c "import torch, vllm; print('gpu_vllm: vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
    local out=${VLLM_CHECK_DIR:-/tmp/vllm-check}
    $PY -m ragen_lit fit --config conf/frozenlake.yaml rollout.engine=vllm trainer.iterations=2 \
        "logging.output_dir=$out" logging.run_name=vllm-fit
    $PY -m ragen_lit evaluate --model "$(ls -d "$out"/vllm-fit-*/ | head -1)" rollout.engine=vllm --out "$out/evaluate.json"
}

case "${1:-}" in
prepare) prepare "${2:-}" ;;
stage) stage "${2:-}" ;;
install) install_wheels ;;
check) check ;;
*) die "give one of: prepare [MIB], stage K, install, check (not '${1:-}')" ;;
esac
