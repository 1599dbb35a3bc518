# The seventh H200 run (4 December 2026, code 9696003), as typed on the device machine after six transfer
# calls (the vLLM bundle in 30 MiB parts, then the data parts; docs/training.md, "First H200 run"). The
# device machine stopped answering during the trainings; what came back is in this folder.
DATA=/root/devdata WORK=/root/ebdq CHATS=4000 EXTRACT_ORIG_TASKS=2 REGEN_CHATS=12000 REGEN_SAMPLES=2 REGEN_TASKS=3 \
  REGEN_BATCH=4000 REGEN_KV_GIB=10 EXTRACT_REGEN_TASKS=5 VERIFY_BESIDE=1 TRAIN_TOGETHER=1 SEEN=0 BRANCHES="" \
  PROMPTS=80 MAX_TOKENS=384 STEPS=100000 BATCH_TOKENS=16384 PROFILE_BATCHES=16384 EVAL_TOKENS=128 EVAL_RESERVE=300 \
  CONCURRENT=1.3 SPEED=0 TRAIN_EXTRA="train.num_workers=4" EVAL_DTYPE=float32 VLLM_USE_FLASHINFER_SAMPLER=0 \
  DEADLINE=$(( T0 + 1600 )) bash scripts/gpu/detached.sh start /root/dq.log \
  bash -c "bash scripts/gpu/draft_quality.sh /root/dqout setup && bash scripts/gpu/draft_quality.sh /root/dqout parallel"
