"""The draft-quality experiment's token budget (scripts/gpu/draft_quality.sh calibrate).

The rate of one trainer alone comes from profile-train's records (OUT/profile-<batch_tokens>.json, written by
lab/train_step_probe.py) when there are some, else from the calibration training's last logged window. With
profiles at two batch sizes the larger is taken when it trains at least LARGER_BATCH_GAIN times as many
tokens per second: a step bound by the host (launches, Python) costs about the same at twice the tokens, so
the larger batch then sees more data in nearly as many steps; below that gain the smaller keeps the number
of optimizer steps. The drafts train side by side on one GPU, so each gets at worst 1/CONCURRENT of that
rate; the budget is what each then finishes before the deadline, rounded down to whole epochs of the orig
states (speculators' trainer counts in epochs) and capped at the requested STEPS.

    python3 dq_budget.py WORK ENV_OUT BATCH_TOKENS DEADLINE RESERVE_S CONCURRENT MAX_STEPS [OUT]
"""

import json
import sys
import time
from pathlib import Path

from eagle_batch.store import open_dataset

LARGER_BATCH_GAIN = 1.6


def rate_from_profiles(out: Path, batch_tokens: int) -> tuple[float, int, str] | None:
    """(tokens/s, batch tokens, why) from the profile records, or None when there are none."""
    recs = sorted((json.loads(f.read_text()) for f in out.glob("profile-*.json")), key=lambda r: r["batch_tokens"])
    recs = [r for r in recs if r.get("tokens_per_s")]
    if not recs:
        return None
    best = next((r for r in recs if r["batch_tokens"] == batch_tokens), recs[0])
    for r in recs:
        if r["batch_tokens"] > best["batch_tokens"] and r["tokens_per_s"] >= LARGER_BATCH_GAIN * best["tokens_per_s"]:
            best = r
    seen = ", ".join(f"{r['batch_tokens']}: {r['tokens_per_s']:,} tok/s" for r in recs)
    return float(best["tokens_per_s"]), int(best["batch_tokens"]), f"profiles ({seen})"


def rate_from_calibration(work: Path) -> float:
    logs = [json.loads(x) for x in (work / "run-orig/train/calibrate/metrics.jsonl").read_text().splitlines()]
    return [m["tokens_per_s"] for m in logs if "tokens_per_s" in m][-1]  # the last window: past warm-up


def main(argv: list[str]) -> None:
    work, env_out = Path(argv[0]), Path(argv[1])
    batch_tokens, deadline, reserve, concurrent, max_steps = (float(x) for x in argv[2:7])
    measured = rate_from_profiles(Path(argv[7]), int(batch_tokens)) if len(argv) > 7 else None
    if measured is not None:
        rate, bt, source = measured
    else:
        rate, bt, source = rate_from_calibration(work), int(batch_tokens), "calibration training"
    tokens = int(open_dataset(work / "run-orig").lengths().sum())
    left = deadline - time.time() - reserve if deadline else float("inf")
    fit = rate / concurrent * left * 0.85
    want = min(max_steps * bt, fit)
    epochs = int(want // tokens)
    steps = max(1, int((epochs * tokens if epochs else want) // bt))
    print(
        f"rate alone {rate:,.0f} tok/s from the {source}; batch {bt} tokens; {left:.0f} s left for training; "
        f"orig states {tokens:,} tokens; budget {steps} steps x {bt} = {steps * bt / 1e6:.1f} M tokens "
        f"({steps * bt / tokens:.2f} epochs of orig)"
    )
    env_out.write_text(f"STEPS={steps}\nBATCH_TOKENS={bt}\nSPEC_EPOCHS={max(1, epochs)}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
