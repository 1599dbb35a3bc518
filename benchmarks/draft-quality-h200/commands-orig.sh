# The original-answers and untrained drafts of the draft-quality experiment, as typed on the H200 machine with
# the tree in /root/repo and T0 the start of the device lease (`date +%s > /root/t0`); DEADLINE leaves the
# evaluation its reserve before the lease ends.
cd /root/repo && T0=$(cat /root/t0) && DATA=/root/devdata WORK=/root/ebdq CHATS=2000 REGEN_CHATS=12000 \
  REGEN_SAMPLES=2 REGEN_TASKS=3 REGEN_BATCH=4000 REGEN_KV_GIB=10 EXTRACT_REGEN_TASKS=5 VERIFY_BESIDE=1 \
  TRAIN_TOGETHER=1 SEEN=0 BRANCHES="" PROMPTS=80 MAX_TOKENS=384 STEPS=100000 BATCH_TOKENS=16384 \
  PROFILE_BATCHES=16384 EVAL_TOKENS=128 EVAL_RESERVE=220 EVAL_KS=3 CONCURRENT=1.3 SPEED=0 \
  TRAIN_EXTRA="train.num_workers=4" EVAL_DTYPE=float32 VLLM_USE_FLASHINFER_SAMPLER=0 DEADLINE=$(( T0 + 1450 )) \
  bash scripts/gpu/detached.sh start /root/dq.log \
  bash -c "bash scripts/gpu/draft_quality.sh /root/dqout setup && bash scripts/gpu/draft_quality.sh /root/dqout parallel"
# then, in later calls: bash scripts/gpu/detached.sh watch /root/dq.log 560 /root/dqout "$OUT/dqout.tgz"
