"""The draft-quality experiment's token budget, from a short calibration training (scripts/gpu/draft_quality.sh
calibrate): the drafts train side by side on one GPU, so each gets at worst 1/CONCURRENT of the calibrated
rate; the budget is what each then finishes before the deadline, rounded down to whole epochs of the
orig states (speculators' trainer counts in epochs) and capped at the requested STEPS.

    python3 dq_budget.py WORK ENV_OUT BATCH_TOKENS DEADLINE RESERVE_S CONCURRENT MAX_STEPS
"""

import json
import sys
import time
from pathlib import Path

from eagle_batch.store import open_dataset


def main(argv: list[str]) -> None:
    work, env_out = Path(argv[0]), Path(argv[1])
    batch_tokens, deadline, reserve, concurrent, max_steps = (float(x) for x in argv[2:7])
    logs = [json.loads(x) for x in (work / "run-orig/train/calibrate/metrics.jsonl").read_text().splitlines()]
    rate = [m["tokens_per_s"] for m in logs if "tokens_per_s" in m][-1]  # the last window: past warm-up
    tokens = int(open_dataset(work / "run-orig").lengths().sum())
    left = deadline - time.time() - reserve if deadline else float("inf")
    fit = rate / concurrent * left * 0.85
    want = min(max_steps * batch_tokens, fit)
    epochs = int(want // tokens)
    steps = int((epochs * tokens if epochs else want) // batch_tokens)
    steps = max(1, steps)
    print(
        f"calibration: {rate:,.0f} tok/s alone; {left:.0f} s left for training; orig states {tokens:,} tokens; "
        f"budget {steps} steps x {batch_tokens:.0f} = {steps * batch_tokens / 1e6:.1f} M tokens "
        f"({steps * batch_tokens / tokens:.2f} epochs of orig)"
    )
    env_out.write_text(f"STEPS={steps}\nSPEC_EPOCHS={max(1, epochs)}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
