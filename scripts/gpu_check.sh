#!/usr/bin/env bash
# Does this install train on these GPUs? Run it after installing on a GPU machine, and before any change to code that
# runs on a GPU is merged:
#
#   bash scripts/gpu_check.sh            # every visible GPU; CUDA_VISIBLE_DEVICES=0,1 bash scripts/gpu_check.sh for two
#   bash scripts/gpu_check.sh single     # only the one-GPU checks (about 7 minutes on two H200s)
#   bash scripts/gpu_check.sh multi      # only the checks over several GPUs (its longest lane, the NCCL tests: 5 min)
#   GPU_CHECK_ONLY='ppo fsdp' bash scripts/gpu_check.sh multi   # only the checks whose name matches (grep -E): a rerun
#
# On all visible GPUs it runs (single-GPU checks side by side on different GPUs where there are several; the multi-GPU
# checks in three lanes side by side on all of them, since none of them needs a GPU's whole memory or compute):
#   cuda tests          the tests marked `cuda` (kernels, the CUDA-graph decode, the fused and split decode paths)
#   fast = exact        the engine's fast rollout path samples what its exact path samples (tests/engines, cuda)
#   README fit          `python -m ragen_lit fit --config conf/frozenlake.yaml` on one GPU, as the README runs it
#   evaluate            `evaluate` of the README fit's run: its final validation replayed, and pass@4 at temperature 1
#   fsdp, 1 GPU         a short GRPO fit under trainer.strategy=fsdp on one GPU
#   exactness, NCCL     2 NCCL ranks reproduce the single process: FSDP and DDP updates (every preset, LoRA), the MI
#                       diagnostics and metrics (RAGEN_LIT_TEST_DEVICE=cuda; needs 2 GPUs)
#   ppo ddp/fsdp xN     short PPO fits (policy + critic, KL reference) under DDP and FSDP on every GPU, with the fast
#                       rollout path and the exact one; the FSDP run then resumes from its sharded checkpoint
#   lora ddp xN         a short GRPO fit with LoRA adapters under DDP on every GPU
#   bench step          scripts/bench_step.py --pipeline-only: multi-turn PPO steps of the 0.5B shape at the defaults
#                       (a check that it runs; its timing is a benchmark's only when nothing else shares the machine)
# and prints one table (check, result, seconds, commit, card). Exit status 1 if any check failed; every check's log is
# kept in the folder printed at the top (GPU_CHECK_DIR to choose it). PYTHON names the interpreter (default python);
# RAGEN_LIT_COMMIT names the code's commit where the tree is not its git checkout (a copy, a container image); the
# runs' MLflow tags take it too.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-all}
case $PART in all | single | multi) ;; *) echo "gpu_check: part '$PART' is not all, single or multi" >&2; exit 2 ;; esac
PY=${PYTHON:-python}
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible to $PY (torch.cuda.device_count() is 0)" >&2
    exit 2
fi
OUT=${GPU_CHECK_DIR:-$(mktemp -d -t gpu_check.XXXX)}
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: >"$RESULTS"
COMMIT=${RAGEN_LIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -n "${RAGEN_LIT_COMMIT:-}" ] || git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"
CARD="$GPUS x $($PY -c "import torch; print(torch.cuda.get_device_name(0))")"
echo "gpu_check: $CARD, commit $COMMIT, logs in $OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

# `check NAME GPUS COMMAND...`: run COMMAND with CUDA_VISIBLE_DEVICES=GPUS (a comma-separated list of visible
# indices), log to $OUT/<slug>.log, append "NAME<TAB>result<TAB>seconds" to the results. A check may print a line
# "gpu_check: NOTE" that becomes its result's note.
check() {
    local name=$1 gpus=$2
    shift 2
    local slug log start status note
    if [ -n "${GPU_CHECK_ONLY:-}" ] && ! echo "$name" | grep -qE -- "$GPU_CHECK_ONLY"; then return 0; fi
    slug=$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
    log="$OUT/$slug.log"
    start=$SECONDS
    # a check that hangs fails on its own instead of taking the others' time (a function runs in a child bash)
    if declare -F "$1" >/dev/null; then set -- bash -c "$1"; fi
    CUDA_VISIBLE_DEVICES=$(visible "$gpus") timeout "${GPU_CHECK_TIMEOUT:-600}" "$@" >"$log" 2>&1
    status=$?
    note=$(grep -a '^gpu_check: ' "$log" | tail -1 | cut -c12-)
    if [ $status -eq 0 ]; then
        result="pass${note:+ ($note)}"
    else
        result="FAIL (exit $status, $slug.log: $(grep -av '^\s*$' "$log" | tail -1 | cut -c1-90))"
    fi
    printf '%s\t%s\t%d\n' "$name" "$result" $((SECONDS - start)) >>"$RESULTS"
}

# the device ids behind visible indices (so that CUDA_VISIBLE_DEVICES given to this script is respected)
visible() {
    if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
        echo "$1"
    else
        local ids
        IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
        local out=() i
        IFS=, read -ra picks <<<"$1"
        for i in "${picks[@]}"; do out+=("${ids[$i]}"); done
        (IFS=,; echo "${out[*]}")
    fi
}

ALL=$(seq -s, 0 $((GPUS - 1)))
LAST=$((GPUS - 1))
# the fit checks' shared size: a few iterations of small batches, diagnostics and validation included
SHORT=(rollout.groups=8 rollout.group_size=4 validation.num_envs=16 validation.every_n_iterations=2
    diagnostics.every_n_iterations=2 trainer.checkpoint_every=2)
# the engine's exact sampling path against its default (fast) one
EXACT=(rollout.exact=true)

readme_fit() {
    local log
    log=$($PY -m ragen_lit fit --config conf/frozenlake.yaml "logging.output_dir=$OUT/readme" 2>&1 | tee /dev/stderr)
    echo "gpu_check: validation $(echo "$log" | grep -a 'validation success' | tail -1 | awk '{print $(NF-2), $(NF-1), $NF}')"
}

evaluate_readme() {
    local run
    run=$(ls -d "$OUT"/readme/frozenlake-*/ | head -1)
    $PY -m ragen_lit evaluate --model "$run" --out "$OUT/evaluate.json" || return
    $PY -m ragen_lit evaluate --model "$run" --samples 4 --temperature 1.0 --out "$OUT/evaluate_k4.json" || return
    $PY - "$run" "$OUT/evaluate.json" "$OUT/evaluate_k4.json" <<'EOF'
import json, sys
final = json.load(open(f"{sys.argv[1]}/run.json"))["finished"]["summary"]["val_success_final"]
replay, = json.load(open(sys.argv[2]))["environments"]
sampled, = json.load(open(sys.argv[3]))["environments"]
print(f"gpu_check: replay {replay['success']:.3f} (fit's final validation {final:.3f}), "
      f"pass@4 {sampled['pass_at']['4']:.3f} at temperature 1")
EOF
}

bench_step() {
    $PY scripts/bench_step.py --pipeline-only --iterations 3 --out "$OUT/bench_step.json" || return
    $PY - "$OUT/bench_step.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
s, t = r["step"], r["throughput"]
print(f"gpu_check: step {s['step_s']:.2f} s, generation {t['generation_tokens_per_s'] / 1e3:.1f}k tokens/s, "
      f"update MFU {t['update_mfu']:.1%}")
EOF
}

export -f readme_fit evaluate_readme bench_step
export PY OUT

# 1. single-GPU checks, side by side when there are GPUs to spare: GPU 0 runs the tests and the one-GPU FSDP fit, the
# last GPU the README's fit and the benchmark step
if [ "$PART" != multi ]; then
    {
        check "cuda tests" 0 $PY -m pytest -p no:cacheprovider -q -m cuda tests --ignore=tests/engines
        check "fast = exact" 0 $PY -m pytest -p no:cacheprovider -q -m cuda tests/engines
        check "fsdp, 1 GPU" 0 $PY -m ragen_lit fit --config conf/frozenlake.yaml "${SHORT[@]}" trainer.iterations=3 \
            trainer.strategy=fsdp trainer.devices=1 logging.run_name=fsdp-1 "logging.output_dir=$OUT/runs"
    } &
    check "README fit" "$LAST" readme_fit
    check "evaluate" "$LAST" evaluate_readme
    check "bench step" "$LAST" bench_step
    wait
fi

# 2. checks over several GPUs in three lanes side by side: the exactness tests; DDP, FSDP and FSDP's resume (in this
# order: the resume continues the FSDP run); the exact rollout path under FSDP, then LoRA. Each lane writes its own
# MLflow store (one SQLite file takes one writer at a time)
if [ "$PART" != single ] && [ "$GPUS" -ge 2 ]; then
    PPO=(--config conf/frozenlake.yaml "${SHORT[@]}" algo=ppo algo.kl_coef=0.01 trainer.devices="$GPUS")
    LANE2=("logging.output_dir=$OUT/runs-ddp-fsdp")
    LANE3=("logging.output_dir=$OUT/runs-exact-lora")
    check "exactness, NCCL x2" 0,1 env RAGEN_LIT_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q -m "not vllm" \
        tests/parallel/test_fsdp.py::test_fsdp_step_equals_single_process_step tests/parallel/test_multirank_update.py \
        tests/metrics/test_collapse_distributed.py tests/metrics/test_mi_distributed.py &
    {
        check "ppo ddp x$GPUS" "$ALL" $PY -m ragen_lit fit "${PPO[@]}" trainer.iterations=2 trainer.strategy=ddp \
            logging.run_name=ppo-ddp "${LANE2[@]}"
        check "ppo fsdp x$GPUS" "$ALL" $PY -m ragen_lit fit "${PPO[@]}" trainer.iterations=2 trainer.strategy=fsdp \
            logging.run_name=ppo-fsdp "${LANE2[@]}"
        check "ppo fsdp x$GPUS, resumed" "$ALL" $PY -m ragen_lit fit "${PPO[@]}" trainer.iterations=3 \
            trainer.strategy=fsdp logging.run_name=ppo-fsdp trainer.resume=last "${LANE2[@]}"
    } &
    {
        check "ppo fsdp x$GPUS, exact" "$ALL" $PY -m ragen_lit fit "${PPO[@]}" trainer.iterations=2 \
            trainer.strategy=fsdp "${EXACT[@]}" logging.run_name=ppo-fsdp-exact "${LANE3[@]}"
        check "lora ddp x$GPUS, exact" "$ALL" $PY -m ragen_lit fit --config conf/frozenlake.yaml "${SHORT[@]}" \
            trainer.iterations=2 trainer.devices="$GPUS" trainer.strategy=ddp model.lora.r=8 algo.kl_coef=0.01 \
            "${EXACT[@]}" logging.run_name=lora-ddp "${LANE3[@]}"
    } &
    wait
fi

$PY - "$RESULTS" "$COMMIT" "$CARD" <<'EOF'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
commit, card = sys.argv[2], sys.argv[3]
print(f"\n| check | result | seconds | commit | card |\n| --- | --- | ---: | --- | --- |")
for name, result, seconds in rows:
    print(f"| {name} | {result} | {seconds} | {commit} | {card} |")
EOF
if grep -q $'\tFAIL' "$RESULTS"; then
    echo "gpu_check: $(grep -c $'\tFAIL' "$RESULTS") of $(wc -l <"$RESULTS") checks failed"
    exit 1
fi
echo "gpu_check: all $(wc -l <"$RESULTS") checks passed"
