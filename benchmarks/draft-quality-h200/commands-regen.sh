# The regenerated-data draft of the draft-quality experiment, as typed on the H200 machine with the tree in
# /root/repo and T0 the start of the device lease (`date +%s > /root/t0`); DEADLINE leaves the evaluation its
# reserve before the lease ends.
cd /root/repo && T0=$(cat /root/t0) && DATA=/root/devdata WORK=/root/ebdq CHATS=2000 REGEN_CHATS=12000 \
  REGEN_SAMPLES=2 REGEN_TASKS=3 REGEN_BATCH=4000 REGEN_KV_GIB=10 EXTRACT_REGEN_TASKS=5 VERIFY_BESIDE=1 \
  DRAFTS=regen BRANCHES="" CALIBRATE=0 STEPS=6975 BATCH_TOKENS=16384 PROMPTS=80 MAX_TOKENS=384 EVAL_TOKENS=128 \
  EVAL_RESERVE=190 FIT=1 EVAL_KS=3 SPEED=0 TRAIN_EXTRA="train.num_workers=4" EVAL_DTYPE=float32 \
  VLLM_USE_FLASHINFER_SAMPLER=0 DEADLINE=$(( T0 + 1133 )) \
  bash scripts/gpu/detached.sh start /root/dq.log \
  bash -c "bash scripts/gpu/draft_quality.sh /root/dqout setup && bash scripts/gpu/draft_quality.sh /root/dqout parallel"
# then: bash scripts/gpu/detached.sh watch /root/dq.log 500 /root/dqout "$OUT/dqout.tgz"
# train-regen trained its 5,699 steps and saved their checkpoint, then exited 1 as its data workers were
# stopped (train-regen-first.txt: "DataLoader worker (pid 5262) is killed by signal: Aborted"), before the
# export. The same stage again (the same `eagle-batch train` command, which resumed at its last step and
# exported), then the evaluation (resume-and-evaluate.log):
cd /root/repo && DATA=/root/devdata WORK=/root/ebdq CHATS=2000 REGEN_CHATS=12000 REGEN_SAMPLES=2 REGEN_TASKS=3 \
  DRAFTS=regen BRANCHES="" CALIBRATE=0 STEPS=6975 BATCH_TOKENS=16384 PROMPTS=80 MAX_TOKENS=384 EVAL_TOKENS=128 \
  EVAL_KS=3 SPEED=0 TRAIN_EXTRA="train.num_workers=4" EVAL_DTYPE=float32 VLLM_USE_FLASHINFER_SAMPLER=0 \
  bash scripts/gpu/draft_quality.sh /root/dqout train-regen evaluate summary
# and k=5 with the device time left (evaluate-regen-k5.*):
eagle-batch evaluate /root/ebdq/run-regen --draft /root/ebdq/run-regen/train/regen/export --k 5 \
  --prompts /root/ebdq/prompts.jsonl --max-tokens 128 --batch 16 --dtype float32 --gpu-memory-utilization 0.15 \
  --kv-cache-gib 2 --out evaluate-regen-k5.json
