"""Serving a trained draft with vLLM: the target alone and with the draft, outputs compared, acceptance measured.

- `serve_check.measure_acceptance(target, draft_dir, prompts, k)`: the serving check (each engine in its own
  process), used by `eagle-batch evaluate` (eagle_batch/cli/evaluate.py) and the demo.

It sits above train, capture and data: it renders prompts with data's chat templates and reads vLLM's
metrics with capture's version shims, so that train itself needs neither.
"""
