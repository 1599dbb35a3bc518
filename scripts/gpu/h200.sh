#!/usr/bin/env bash
# GPU validation and benchmarks on the H200 device machine (results in docs/explanation/capture-path.md and
# docs/explanation/performance.md). Needs vLLM 0.26.0 there: the device bundle (see docs/explanation/capture-path.md) must have
# been unpacked, i.e. /root/site/.complete exists. Usage: bash scripts/gpu/h200.sh STAGE OUTDIR
#   validate-tp1 | validate-tp2 | validate-dsv3-tp1 | validate-dsv3-tp2 | bench-capture |
#   bench-capture-nofsync | bench-capture-nofsync-noadaptive | bench-capture-shm | bench-capture-like-stock |
#   bench-capture-durable | bench-capture-inprocess | bench-capture-trace | bench-capture-diagnose |
#   bench-capture-sweep | bench-capture-8b | bench-capture-fp8 | bench-loader
set -uo pipefail
stage=${1:?stage}
out=${2:?output folder}
mkdir -p "$out"
export PYTHONPATH=$PWD:/root/extra:/root/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The bench's stock-connector phase starts vLLM's engine process after CUDA is initialised: spawn, not fork.
export VLLM_WORKER_MULTIPROC_METHOD=spawn
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/root/ebwork
sampler=
mkdir -p $work
rm -f $work/cap/phase-*.json  # an earlier stage's phase results must not be copied out as this stage's
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import vllm, torch, transformers, zarr; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'zarr', zarr.__version__)"
} > "$out/env-$stage.txt" 2>&1
case "$stage" in
  validate-tp1) python3 -m eagle_batch.bench.gpu_validate --models llama-1b,dsv3-moe --tp 1 --out $work/val --json ;;
  validate-tp2) python3 -m eagle_batch.bench.gpu_validate --models llama-1b,dsv3-moe --tp 2 --out $work/val --json ;;
  validate-dsv3-tp1) python3 -m eagle_batch.bench.gpu_validate --models dsv3-moe,dsv3-moe-fixedroute --tp 1 \
                   --fp32-reference --out $work/val --json ;;
  validate-dsv3-tp2) python3 -m eagle_batch.bench.gpu_validate --models dsv3-moe,dsv3-moe-fixedroute --tp 2 \
                   --fp32-reference --out $work/val --json ;;
  bench-capture) python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir $work/cap --json ;;
  bench-capture-nofsync) python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir $work/cap --no-fsync --phases eagle-batch --json ;;
  bench-capture-nofsync-noadaptive) python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 \
                   --prompt-len 512 --work-dir $work/cap --no-fsync --no-adaptive --phases eagle-batch --json ;;
  bench-capture-shm) # is the no-fsync limit the disk behind the page cache? the same run with the store in RAM
                   grep -H . /proc/sys/vm/dirty_* >&2
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir /dev/shm/ebcap --no-fsync --phases plain,eagle-batch,stock --json ;;
  bench-capture-like-stock) # the stock connector never fsyncs: eagle-batch with store.fsync=false is the like-for-like
                   # comparison; every phase with the engine in vLLM's background process (stock always is).
                   # Per-thread CPU every 10 s (top -H) shows which threads and processes the cores go to.
                   ( while sleep 10; do date -u +%T; top -b -H -n 1 -w 200 | head -45; done ) > "$out/top-$stage.txt" 2>&1 & sampler=$!
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir $work/cap --no-fsync --engine-process background --phases plain,eagle-batch,stock \
                   --timeout 240 --json ;;
  bench-capture-durable) # the same eagle-batch phase with store.fsync=true (the default), bounded by the disk; run
                   # right after bench-capture-like-stock on the same machine, whose plain phase it is read against
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir $work/cap --engine-process background --phases eagle-batch --timeout 240 --json ;;
  bench-capture-inprocess) # the like-stock eagle-batch phase with the engine in this process (TP=1's default); run
                   # right after bench-capture-like-stock on the same machine, whose plain phase it is read against
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                   --work-dir $work/cap --no-fsync --engine-process in-process --phases eagle-batch --timeout 240 --json ;;
  bench-capture-trace) # the like-stock eagle-batch phase with the store's timeline (store.trace_dir),
                   # summarised by lab/trace_summary.py: which stage the writer waits for
                   rm -rf $work/trace
                   python3 -m eagle_batch.bench.capture --build llama-1b --store-trace $work/trace \
                   --num-prompts 2048 --prompt-len 512 --work-dir $work/cap --no-fsync --engine-process background \
                   --phases plain,eagle-batch --timeout 240 --json
                   python3 lab/trace_summary.py $work/trace > "$out/trace-summary.json"
                   tar -czf "$out/trace.tgz" -C $work trace ;;
  bench-capture-diagnose) # which resource the like-stock eagle-batch phase is short of: traced runs of the same phase
                   # with the default store (after plain), with codec none (no compression CPU) and with half the
                   # compression threads (less contention for the GIL); one trace summary each
                   rm -rf $work/trace-*
                   for v in default none t15; do
                     phases=eagle-batch; extra=(); threads=()
                     case $v in
                       default) phases=plain,eagle-batch ;;
                       none) extra=(--codec none) ;;
                       t15) threads=(--store-threads 15) ;;
                     esac
                     python3 -m eagle_batch.bench.capture "${threads[@]}" --store-trace $work/trace-$v \
                       --build llama-1b --num-prompts 2048 --prompt-len 512 --work-dir $work/cap --no-fsync \
                       --engine-process background --phases $phases "${extra[@]}" --timeout 240 --json
                     for f in "$work"/cap/phase-eagle-batch-*.json; do cp "$f" "$out/$v-$(basename "$f")"; done
                     python3 lab/trace_summary.py $work/trace-$v > "$out/trace-summary-$v.json"
                   done
                   tar -czf "$out/trace.tgz" -C $work trace-default trace-none trace-t15 ;;
  bench-capture-sweep) # like-stock, with the eagle-batch phase as several runs on one engine (same warm engine, so
                   # their ratios carry less noise than separate phases): by default the capture alone without a
                   # store (drop), the default store twice, c-blosc's own zstd-1 (cblosc: store.entropy_only
                   # off), codec none. SWEEP=... overrides the list (bench capture --sweep "NAME[:key=value,...];...",
                   # e.g. "drop;default;t8:threads=8;io4:io_threads=4;none:codec=none;default;drop"; the sweeps
                   # behind docs/decisions/0014, 0015 and 0018 are written out there);
                   # SPREAD=0.5 gives prompts of 256..768 tokens (chat-like varied lengths) instead of 512 each.
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 \
                     --prompt-len-spread "${SPREAD:-0}" --work-dir $work/cap --no-fsync --engine-process background \
                     --phases plain,eagle-batch,stock --sweep "${SWEEP:-drop;default;cblosc:entropy=0;none:codec=none;default;drop}" \
                     --timeout 300 --json ;;
  bench-capture-fp8) # the float8 store beside plain and the bf16 store in one run (issue #25), eager engines
                   # with a 0.3 memory share (so it can run beside another job's engines)
                   python3 -m eagle_batch.bench.capture --build llama-1b --num-prompts 1024 --prompt-len 512 \
                     --no-fsync --enforce-eager --engine-process background --gpu-memory-utilization 0.3 \
                     --phases plain,eagle-batch,eagle-batch-fp8 --work-dir $work/cap --timeout 240 --json ;;
  bench-capture-8b) # a Llama-3.1-8B-shaped model (the compute-bound case, where capture should cost little):
                   # plain, eagle-batch's default store and the stock connector on one engine process each
                   python3 -m eagle_batch.bench.capture --build llama-8b --num-prompts 1024 --prompt-len 512 \
                     --work-dir $work/cap --no-fsync --engine-process background --phases plain,eagle-batch,stock \
                     --timeout 300 --json ;;
  bench-loader) python3 -m eagle_batch.bench.loader --step-sim --hidden 7168 --samples 192 --workers 8 \
                   --sim-workers 8 --device cuda --dir $work/loader --json ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac > "$out/$stage.json" 2> "$out/$stage.log"
rc=$?
[ -n "${sampler:-}" ] && kill $sampler 2>/dev/null
# Each phase's own result survives a later phase's failure or a cut-off call.
cp $work/cap/phase-*.json "$out/" 2>/dev/null
tail -c 3000 "$out/$stage.log"
cat "$out/$stage.json"
exit $rc
