# The sixth H200 run (4 December 2026, code bdb53c0), as typed on the device machine. Before it, four
# transfer calls brought the vLLM bundle and the data parts (docs/training.md, "First H200 run").
# Call 5: the run, detached (T0 = the first call's start); results in run/.
DATA=/root/devdata WORK=/root/ebdq CHATS=2000 REGEN_CHATS=12000 REGEN_SAMPLES=2 REGEN_TASKS=3 REGEN_BATCH=4000 \
  REGEN_KV_GIB=10 EXTRACT_REGEN_TASKS=5 VERIFY_BESIDE=1 TRAIN_TOGETHER=1 SEEN=1 BRANCHES="" PROMPTS=80 \
  MAX_TOKENS=384 STEPS=100000 BATCH_TOKENS=16384 PROFILE_BATCHES=16384 EVAL_TOKENS=128 EVAL_RESERVE=330 \
  CONCURRENT=1.2 SPEED=0 TRAIN_EXTRA="train.num_workers=4" EVAL_DTYPE=float32 VLLM_USE_FLASHINFER_SAMPLER=0 \
  DEADLINE=$(( T0 + 1520 )) bash scripts/gpu/detached.sh start /root/dq.log \
  bash -c "bash scripts/gpu/draft_quality.sh /root/dqout setup && bash scripts/gpu/draft_quality.sh /root/dqout parallel"
# Calls 6-7: the regen draft again on the same states, alone on the GPU, for the rest of the device time
# (the run's budget had used a quarter of its window); results in longer/.
out=/root/dqout2 work=/root/ebdq repo=/root/repo NAME=long; source scripts/gpu/cli_run.sh
export EAGLE_BATCH_CACHE=/root/ebdq/cache
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step train-regen-long eagle-batch train /root/ebdq/run.yaml \
  run_dir=/root/ebdq/run-regen train.name=regen-long train.steps=4000 train.batch_tokens=16384 train.max_time_s=260 \
  train.num_workers=4 "data.inputs=[/root/ebdq/run-regen/regenerate/output,/root/ebdq/run-regen/regenerate-1/output]" \
  data.format=messages data.limit=0 --local --no-progress
step evaluate-regen-long eagle-batch evaluate /root/ebdq/run-regen --draft /root/ebdq/run-regen/train/regen-long/export \
  --k 3 5 --prompts /root/ebdq/prompts.jsonl --max-tokens 128 --batch 16 --dtype float32 --out $out/evaluate-regen-long.json
eagle-batch evaluate /root/ebdq/run-regen --draft /root/ebdq/run-regen/train/regen-long/export --k 3 \
  --prompts /root/ebdq/seen-prompts.jsonl --max-tokens 128 --batch 16 --dtype float32 \
  --out $out/evaluate-regen-long-seen.json > $out/evaluate-regen-long-seen.txt 2>&1
