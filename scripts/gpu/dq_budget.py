"""The draft-quality experiment's token budget (scripts/gpu/draft_quality.sh calibrate).

The batch size comes from profile-train's records (OUT/profile-<batch_tokens>.json, written by
lab/train_step_probe.py): with profiles at two batch sizes the larger is taken when it trains at least
LARGER_BATCH_GAIN times as many tokens per second: a step bound by the host (launches, Python) costs about
the same at twice the tokens, so the larger batch then sees more data in nearly as many steps; below that
gain the smaller keeps the number of optimizer steps. The rate comes from a short real training at that
batch size (its last logged window): the profiler slows every step, so a profile's tokens/s is a ratio
between batch sizes, not a rate (on the H200: 93k tok/s profiled, 190-270k in the trainings after it).
The drafts train side by side on one GPU, so each gets at worst 1/CONCURRENT of that rate; the budget is
what each then finishes before the deadline, rounded down to whole epochs of the orig states (speculators'
trainer counts in epochs) and capped at the requested STEPS.

    python3 dq_budget.py batch OUT BATCH_TOKENS       (prints the batch size to calibrate at)
    python3 dq_budget.py WORK ENV_OUT BATCH_TOKENS DEADLINE RESERVE_S CONCURRENT MAX_STEPS [OUT]
"""

import json
import sys
import time
from pathlib import Path

from eagle_batch.store import open_dataset

LARGER_BATCH_GAIN = 1.6


def batch_from_profiles(out: Path, batch_tokens: int) -> tuple[int, float | None, str]:
    """(batch tokens, that profile's tokens/s or None, what was seen) from the profile records."""
    recs = sorted((json.loads(f.read_text()) for f in out.glob("profile-*.json")), key=lambda r: r["batch_tokens"])
    recs = [r for r in recs if r.get("tokens_per_s")]
    if not recs:
        return batch_tokens, None, "no profiles"
    best = next((r for r in recs if r["batch_tokens"] == batch_tokens), recs[0])
    for r in recs:
        if r["batch_tokens"] > best["batch_tokens"] and r["tokens_per_s"] >= LARGER_BATCH_GAIN * best["tokens_per_s"]:
            best = r
    seen = ", ".join(f"{r['batch_tokens']}: {r['tokens_per_s']:,} tok/s" for r in recs)
    return int(best["batch_tokens"]), float(best["tokens_per_s"]), f"profiles {seen}"


def rate_from_calibration(work: Path) -> float | None:
    """The calibration training's last logged tokens/s (past its warm-up), or None when it has none."""
    try:
        text = (work / "run-orig/train/calibrate/metrics.jsonl").read_text()
    except OSError:
        return None
    rates = [m["tokens_per_s"] for m in map(json.loads, text.splitlines()) if "tokens_per_s" in m]
    return rates[-1] if rates else None


def main(argv: list[str]) -> None:
    if argv[0] == "batch":
        print(batch_from_profiles(Path(argv[1]), int(argv[2]))[0])
        return
    work, env_out = Path(argv[0]), Path(argv[1])
    batch_tokens, deadline, reserve, concurrent, max_steps = (float(x) for x in argv[2:7])
    bt, profiled, seen = (
        batch_from_profiles(Path(argv[7]), int(batch_tokens))
        if len(argv) > 7
        else (int(batch_tokens), None, "no profiles")
    )
    rate, source = rate_from_calibration(work), f"calibration training; {seen}"
    if rate is None:  # the calibration training failed: the profile's rate, low but better than none
        if profiled is None:
            raise SystemExit("dq_budget: no calibration training metrics and no profiles: no rate to budget with")
        rate, source = profiled, f"{seen} (no calibration training)"
    tokens = int(open_dataset(work / "run-orig").lengths().sum())
    left = deadline - time.time() - reserve if deadline else float("inf")
    fit = rate / concurrent * left * 0.85
    want = min(max_steps * bt, fit)
    epochs = int(want // tokens)
    steps = max(1, int((epochs * tokens if epochs else want) // bt))
    print(
        f"rate {rate:,.0f} tok/s from the {source}; batch {bt} tokens; {left:.0f} s left for training; "
        f"orig states {tokens:,} tokens; budget {steps} steps x {bt} = {steps * bt / 1e6:.1f} M tokens "
        f"({steps * bt / tokens:.2f} epochs of orig)"
    )
    env_out.write_text(f"STEPS={steps}\nBATCH_TOKENS={bt}\nSPEC_EPOCHS={max(1, epochs)}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
