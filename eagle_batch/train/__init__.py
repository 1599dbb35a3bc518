"""EAGLE-3 draft training on a run's hidden states (docs/explanation/training.md).

- `model`: the draft (vLLM llama_eagle3 layout), target head, `export_draft`.
- `data`: dataset over `open_dataset(RUN)`, token-budget length-bucketed per-rank batch plan, loader.
- `trainer.train(cfg)`: TTT loop, checkpoint/resume, metrics, DDP.
- `optim.DraftOptimizer`: the optimizers (Muon + AdamW by default, or AdamW) and their one LR schedule.
- `cli`: `eagle-batch train CONFIG [k=v ...] [--local] [--after RUN]`.
- serving the exported draft with vLLM (`eagle-batch evaluate`) is eagle_batch/evaluate/.
"""
