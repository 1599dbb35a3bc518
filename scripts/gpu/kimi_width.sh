#!/usr/bin/env bash
# Kimi-K2.5 at its real width on one GPU (issue 47), through the installed CLI and the shipped
# configs/models/kimi-k2.5.yaml: a random KimiK25ForConditionalGeneration with the real text width, heads,
# MLA dims, MLP sizes, top-k 8 and vocabulary 163,840 (`python -m eagle_batch.models.kimi --real-width`),
# 8 decoder layers and 16 routed experts (~17 GB bf16), drawn on the GPU.
#
#   bash scripts/gpu/kimi_width.sh OUTDIR [STAGE ...]
#     stages (default: all, in this order): setup capture final-layer train evaluate bench probe
#     setup        versions, install eagle-batch, build the model, write the chats and the run's overrides
#     capture      prepare -> extract (native) -> status -> aggregate -> verify -> validate (per-layer cosines)
#                  -> bytes per token of the run's store
#     final-layer  the stored id N against transformers' hidden_states and final norm (lab/final_layer_probe.py)
#     train        train --local from a cold page cache (draft hidden 7168): tokens/s, data_wait_frac, peak memory
#     evaluate     the export served by vLLM as the wrapper's EAGLE-3 drafter: acceptance, identical outputs
#     bench        eagle_batch.bench.capture on this model: plain, default store, FP8 store, stock connector
#     probe        doubling train.batch_tokens until a step fails or PROBE_S seconds are spent
#
# Long: on the device machine (10-minute calls) start it detached and watch it (scripts/gpu/detached.sh):
#   bash scripts/gpu/detached.sh start /root/kw.log bash scripts/gpu/kimi_width.sh /root/kwout
#   bash scripts/gpu/detached.sh watch /root/kw.log 560 /root/kwout $OUT/kimi-width.tgz   # repeat until "ended"
# Every command's output is OUTDIR/NAME.txt, wall times OUTDIR/times.tsv (scripts/gpu/cli_run.sh).
# Input: TOK (default .devdata/tokenizer), the SmolLM2 tokenizer files (see scripts/gpu/kimi.sh).
# Knobs: LAYERS (8), EXPERTS (16), CHATS (120 chats of TURNS=10 exchanges from the demo chats, one sample per
# assistant turn: 56k tokens), STEPS (training steps, 0 = two epochs), PROMPTS (bench prompts of 512
# tokens, 512), BENCH_EXTRA (more bench arguments), PROBE_S (150), EXTRA (key=value overrides for every
# command), WORK (/root/ebwide), RULE (1: a target with a known greedy next token); for a CPU dry run:
# HIDDEN (a narrower width), DROP_CACHES=0 (leave the page cache of a shared machine alone). Results and
# commands: benchmarks/kimi-width-7168-h100/ (RULE=1: benchmarks/kimi-width-7168-rule-h100/).
set -euo pipefail
out=${1:?output folder}
shift
stages=${*:-setup capture bytes final-layer train evaluate bench probe}
tok=$(realpath "${TOK:-.devdata/tokenizer}")
work=${WORK:-/root/ebwide}
repo=$(pwd)
LAYERS=${LAYERS:-8}
EXPERTS=${EXPERTS:-16}
CHATS=${CHATS:-120}
TURNS=${TURNS:-10}
STEPS=${STEPS:-0}
PROMPTS=${PROMPTS:-512}
PROBE_S=${PROBE_S:-150}
DROP_CACHES=${DROP_CACHES:-1}
RULE=${RULE:-0}
mkdir -p "$out" "$work"
NAME=kimi-width
# shellcheck source=scripts/gpu/cli_run.sh
source "$repo/scripts/gpu/cli_run.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
base=configs/models/kimi-k2.5.yaml
cfg=$work/wide.yaml
model=$work/kimi-wide
run=$work/run
# shellcheck disable=SC2206
extra=(${EXTRA:-})
# shellcheck disable=SC2206
bench_extra=(${BENCH_EXTRA:-})
kv=(run_dir="$run" model.path="$model")

# gpu_peak NAME CMD...: step NAME with the GPU's used memory sampled every second (OUT/NAME-gpu-mem.txt)
gpu_peak() {
  local name=$1; shift
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null; sleep 1; done ) \
    > "$out/$name-gpu-mem.txt" & local sampler=$!
  local rc=0
  step "$name" "$@" || rc=$?
  kill "$sampler" 2>/dev/null || true
  say "$name: peak GPU memory used $(sort -n "$out/$name-gpu-mem.txt" | tail -n1) MiB (nvidia-smi)"
  return $rc
}

# Several stages: each runs as its own process (this script with one stage), in order; a failed stage
# skips the stages that need its output, and the others still run.
read -r -a stage_list <<< "$stages"
if [ "${#stage_list[@]}" -gt 1 ]; then
  declare -A needs=([capture]=setup [bytes]=capture [final-layer]=capture [train]=capture [evaluate]=train [bench]=setup [probe]=capture)
  declare -A failed=()
  # The stages run from a copy: a checkout updated while they run (a later call's tree) does not change them.
  self=$work/kimi_width.run.sh
  cp "$0" "$self"
  for stage in "${stage_list[@]}"; do
    need=${needs[$stage]:-}
    if [ -n "$need" ] && [ -n "${failed[$need]:-}" ]; then
      say "skip $stage: $need failed"; failed[$stage]=1; continue
    fi
    say "stage $stage"
    bash "$self" "$out" "$stage" || { say "stage $stage failed (exit $?)"; failed[$stage]=1; }
  done
  cat "$out/times.tsv"
  [ "${#failed[@]}" -eq 0 ]
  exit
fi

for stage in $stages; do
  case $stage in
    setup)
      { print_versions; df -h "$work" | tail -n1; nproc; free -g | head -2; } > "$out/env.txt" 2>&1
      cat "$out/env.txt"
      install_eagle_batch
      # More chat data than the 300 demo chats (27.7k tokens): CHATS chats of TURNS exchanges drawn from
      # theirs (seeded); per_turn (the shipped setting) gives one sample per assistant turn.
      python3 - "$repo/eagle_batch/demo_data/chat.jsonl" "$work/chats.jsonl" "$CHATS" "$TURNS" <<'PY'
import json, random, sys
src, dst, n, turns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pairs, systems = [], []
for line in open(src):
    m = json.loads(line)["messages"]
    systems += [x["content"] for x in m if x["role"] == "system"]
    pairs += [(a["content"], b["content"]) for a, b in zip(m, m[1:]) if a["role"] == "user" and b["role"] == "assistant"]
rng = random.Random(47)
with open(dst, "w") as f:
    for _ in range(n):
        msgs = [{"role": "system", "content": rng.choice(systems)}] if rng.random() < 0.5 else []
        for u, a in rng.sample(pairs, turns):
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        f.write(json.dumps({"messages": msgs}) + "\n")
print(f"{n} chats of {turns} exchanges from {len(pairs)} demo exchanges")
PY
      # RULE=1: the target's greedy next token follows a known rule (models/next_token_rule.py) into the 128
      # most frequent tokens of these chats, so that a draft can learn it and outputs part at no near-tie.
      rule=()
      [ "$RULE" = 1 ] && rule=(--next-token-rule "$work/chats.jsonl")
      # shellcheck disable=SC2086
      step build python3 -m eagle_batch.models.kimi "$model" --fixed-route --real-width --layers "$LAYERS" \
        --experts "$EXPERTS" --tokenizer "$tok" ${HIDDEN:+--hidden $HIDDEN} "${rule[@]}"
      du -sb "$model" > "$out/model-bytes.txt"
      python3 -c "import json, sys; c = json.load(open(sys.argv[1])); print(json.dumps(c['text_config']))" \
        "$model/config.json" > "$out/model-config.txt"
      cat > "$cfg" <<EOF
model:
  name: random-kimi-k2.5-width-7168
  tensor_parallel_size: 1
  trust_remote_code: false
  layer_ids: null   # the default rule on this model's N ($LAYERS layers)
data:
  inputs: [$work/chats.jsonl]
  format: messages
extract:
  num_tasks: 1
slurm:
  executor: local
  gpus_per_node: 1
  cpus_per_task: 12
train:
  name: draft
  batch_tokens: 16384
  log_every: 1
  warmup_steps: 5
  tensorboard: false
  checkpoint_every: 100000
EOF
      cp "$cfg" "$out/wide.yaml"
      ;;
    capture)
      step prepare eagle-batch prepare "$base" "$cfg" "${kv[@]}" "${extra[@]}" --no-progress
      gpu_peak extract eagle-batch extract "$base" "$cfg" "${kv[@]}" "${extra[@]}" --wait --interval 5
      step status eagle-batch status "$run"
      eagle-batch status "$run" --json > "$out/status.json" 2>&1 || true
      step aggregate eagle-batch aggregate "$run"
      step verify eagle-batch verify "$run"
      step validate eagle-batch validate "$run" --samples 16 --json || true
      ;;
    bytes)
      # Bytes per token: the committed store files over the tokens they hold (and the raw bf16 size).
      python3 - "$run" > "$out/store-bytes.json" <<'PY'
import json, sys
from pathlib import Path
from eagle_batch.store import open_dataset
run = Path(sys.argv[1])
ds = open_dataset(run)
tokens = int(ds.lengths().sum())
stores = sorted((run / "stores").glob("task-*.zarr"))
files = [f for s in stores for f in s.rglob("*") if f.is_file()]
disk = sum(f.stat().st_size for f in files)
hidden = ds.spec.hidden_size
raw = tokens * len(ds.layer_ids) * hidden * 2
print(json.dumps({"samples": len(ds), "tokens": tokens, "layer_ids": list(ds.layer_ids), "hidden_size": hidden,
                  "store_bytes": disk, "raw_bf16_bytes": raw, "bytes_per_token": disk / tokens,
                  "kib_per_token": disk / tokens / 1024, "raw_kib_per_token": raw / tokens / 1024,
                  "compression_ratio": raw / disk, "files": len(files),
                  "dirs": sum(1 for s in stores for d in s.rglob("*") if d.is_dir())}, indent=1))
PY
      cat "$out/store-bytes.json"
      ;;
    final-layer)
      step final-layer python3 "$repo/lab/final_layer_probe.py" "$run" --samples 4
      ;;
    train)
      # The loader reads the store from disk, not from the page cache the capture left behind.
      if [ "$DROP_CACHES" = 1 ]; then
        sync; echo 3 > /proc/sys/vm/drop_caches || say "drop_caches refused: the first epoch may read cached pages"
      fi
      steps=()
      [ "$STEPS" -gt 0 ] && steps=(train.steps="$STEPS") || steps=(train.epochs=2)
      gpu_peak train eagle-batch train "$base" "$cfg" "${kv[@]}" "${steps[@]}" "${extra[@]}" --local
      cp "$run/train/draft/metrics.jsonl" "$out/train-metrics.jsonl"
      cp "$run/train/draft/draft_config.json" "$out/draft-config.json"
      python3 - "$out/train-metrics.jsonl" > "$out/train-summary.json" <<'PY'
import json, sys
recs = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
start = next(r for r in recs if r.get("event") == "start")
steps = [r for r in recs if "loss" in r]
per_epoch = start["steps_per_epoch"]
def window(rs):
    if not rs:
        return None
    return {"steps": len(rs), "tokens_per_s_mean": sum(r["tokens_per_s"] for r in rs) / len(rs),
            "data_wait_frac_mean": sum(r["data_wait_frac"] for r in rs) / len(rs),
            "data_wait_frac_max": max(r["data_wait_frac"] for r in rs)}
# Step 1-3 hold start-up (first CUDA kernels, the loader's first batches): left out of the rates.
out = {"steps_per_epoch": per_epoch, "total_steps": start["total_steps"], "num_samples": start["num_samples"],
       "first_epoch_from_disk": window([r for r in steps if 3 < r["step"] <= per_epoch]),
       "later_epochs": window([r for r in steps if r["step"] > per_epoch]),
       "all_after_step_3": window([r for r in steps if r["step"] > 3]),
       "peak_gpu_memory_gib": max(r.get("peak_gpu_memory_gib", 0) for r in steps),
       "final_loss": steps[-1]["loss"], "final_acc": steps[-1]["acc"]}
print(json.dumps(out, indent=1))
PY
      cat "$out/train-summary.json"
      ;;
    evaluate)
      step evaluate eagle-batch evaluate "$run" --num-prompts 8 --k 3 --max-tokens 64 --out "$out/evaluate.json" \
        || step evaluate-bi eagle-batch evaluate "$run" --num-prompts 8 --k 3 --max-tokens 64 \
             --batch-invariant --out "$out/evaluate-bi.json" || true
      ;;
    bench)
      # Room on the disk: the stock connector writes every request's states uncompressed.
      rm -rf "$run"/train/*/checkpoints
      # The stock phase starts vLLM's engine process after CUDA is initialised: spawn, not fork.
      export VLLM_WORKER_MULTIPROC_METHOD=spawn
      # Eager engines (no compile / CUDA graphs: a shorter start for each of the four engines; a
      # prefill-only batch of 8192 tokens runs no CUDA graph either way); the store without fsync as the
      # stock connector writes (docs/explanation/performance.md); engine in vLLM's background process.
      step bench-capture python3 -m eagle_batch.bench.capture --model "$model" --num-prompts "$PROMPTS" \
        --prompt-len 512 --work-dir "$work/cap" --no-fsync --engine-process background --enforce-eager \
        --phases plain,eagle-batch,eagle-batch-fp8,stock --fp8-dtype float8_e5m2 --timeout 300 --json \
        "${bench_extra[@]}" || true
      # The JSON object is the command's stdout; its stderr (phase lines) went to the same file: split.
      python3 - "$out/bench-capture.txt" > "$out/bench-capture.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
start = text.find("{\n")
obj = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else {"error": "no JSON in the bench output"}
print(json.dumps(obj, indent=1))
PY
      cp "$work"/cap/phase-*.json "$out/" 2>/dev/null || true
      ;;
    probe)
      # The largest train.batch_tokens whose steps fit: 3 steps each, doubling, within PROBE_S seconds.
      t0=$(date +%s)
      bt=${PROBE_START:-32768}
      while [ $(( $(date +%s) - t0 )) -lt "$PROBE_S" ]; do
        dir=$work/probe-$bt
        rc=0
        gpu_peak "probe-$bt" eagle-batch train "$base" "$cfg" "${kv[@]}" train.steps=3 train.batch_tokens=$bt \
          train.output_dir="$dir" train.export=false train.max_restarts=0 "${extra[@]}" --local || rc=$?
        peak=$(python3 -c "import json,sys; print(max((json.loads(x).get('peak_gpu_memory_gib', 0) for x in open(sys.argv[1]) if x.strip()), default=0))" "$dir/metrics.jsonl" 2>/dev/null || echo "?")
        echo -e "$bt\texit $rc\tpeak_gpu_memory_gib $peak" >> "$out/probe.tsv"
        rm -rf "$dir"
        [ "$rc" -ne 0 ] && break
        bt=$(( bt * 2 ))
      done
      cat "$out/probe.tsv"
      ;;
    *) echo "unknown stage $stage (setup capture final-layer train evaluate bench probe)"; exit 2 ;;
  esac
done
cat "$out/times.tsv"
