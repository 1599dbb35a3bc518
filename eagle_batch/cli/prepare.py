"""`eagle-batch prepare CONFIG [key=value ...]`: tokenize chat data and plan the extraction array."""

from __future__ import annotations

import argparse
import json
import os
import sys

from eagle_batch.cli.common import add_config_arguments, config_from_args, int_at_least

EPILOG = """bad input rows: with data.on_bad_row=skip (the default) every row that cannot be used is counted by
reason in the summary and listed with its file and line in RUN/prepared/bad_rows.jsonl; data.on_bad_row=error
stops at the first one instead. A whole file that yields nothing (empty, other field names, not UTF-8) is named
with what to change; prepare fails when no sample is left at all. See docs/how-to/troubleshooting.md."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_config_arguments(p)
    p.add_argument(
        "--workers",
        type=int_at_least(0),
        default=0,
        help="tokenizer processes (default: min(CPU count, 8); 1 = in-process)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not print the progress line")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument(
        "--force", action="store_true", help="replace the prepared data even if the run already has extracted stores"
    )


def _truncation_line(s: dict) -> str:
    """How much data.max_length cut: samples, and the assistant tokens (the ones trained on) lost with them."""
    cut = s.get("truncated_loss_tokens", 0)
    return (
        f"  truncated: {s['samples_truncated']} sample(s) longer than data.max_length={s.get('max_length', '?')} "
        f"were cut, dropping {cut:,} assistant (trained) token(s) of {s['loss_tokens'] + cut:,}; raise "
        "data.max_length (and model.max_model_len above it) to keep them"
    )


def _print_summary(s: dict, out_dir: str) -> None:
    from eagle_batch.data.tally import reasons_text

    pct = s.get("length_percentiles") or {}
    lines = [
        f"prepared {out_dir}",
        f"  rows: {s['rows_read']} read, {s['rows_kept']} kept, {s['rows_skipped']} skipped"
        + (f" ({reasons_text(s['skipped_by_reason'])})" if s["skipped_by_reason"] else ""),
        f"  samples: {s['samples']}"
        + (f", dropped {reasons_text(s['samples_dropped_by_reason'])}" if s["samples_dropped_by_reason"] else "")
        + (f", {s['rows_split_per_turn']} rows split per turn" if s["rows_split_per_turn"] else ""),
        *([_truncation_line(s)] if s["samples_truncated"] else []),
        *(
            [
                f"  note: {s['empty_assistant_turns_masked']} assistant turn(s) render to nothing but end-of-turn markers "
                "(a tool call the template does not write?) and are left out of the loss (data.empty_assistant_turns)"
            ]
            if s.get("empty_assistant_turns_masked")
            else []
        ),
        *(
            [
                f"  note: {s['assistant_turns_not_trained']} assistant turn(s) are marked not to be trained on "
                "(0 or false in the field data.turn_train_field names) and are left out of the loss; they stay in the context"
            ]
            if s.get("assistant_turns_not_trained")
            else []
        ),
        *(
            [
                "  note: the chat template does not render "
                + ", ".join(f"{k} ({v} rows)" for k, v in s["rows_with_unrendered_fields"].items())
                + "; those parts are not in the samples"
            ]
            if s.get("rows_with_unrendered_fields")
            else []
        ),
        f"  tokens: {s['tokens']:,} ({s['loss_tokens']:,} with loss, {s['loss_token_fraction']:.1%}: the assistant tokens the draft learns)",
    ]
    if pct:
        lines.append(
            f"  length: min {pct['min']}, p50 {pct['p50']:.0f}, p90 {pct['p90']:.0f}, "
            f"p99 {pct['p99']:.0f}, max {pct['max']}"
        )
    t = s["tasks"]
    lines.append(
        f"  plan: {t['num_tasks']} tasks, {t['min_tokens']:,}..{t['max_tokens']:,} tokens each"
        + (f", {t['empty_tasks']} empty (fewer samples than tasks)" if t["empty_tasks"] else "")
    )
    if s["skipped_by_reason"].get("truncated_file"):
        lines.append(
            f"  warning: {s['skipped_by_reason']['truncated_file']} input file(s) end in the middle of a "
            "record (cut off); their complete records were read"
        )
    lines += [f"  warning: {w}" for w in s.get("file_warnings", [])]
    if s["rows_skipped"] or s["samples_dropped_by_reason"]:
        lines.append(
            f"  skipped rows are listed in {os.path.join(out_dir, 'bad_rows.jsonl')} (data.on_bad_row=skip; "
            "set data.on_bad_row=error to stop at the first bad row instead)"
        )
    lines.append(
        f"  {s['elapsed_s']:.1f} s in all; processing {s['process_s']:.1f} s: {s['rows_per_s']:,.0f} rows/s, "
        f"{s['tokens_per_s']:,.0f} tokens/s"
    )
    print("\n".join(lines), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from eagle_batch.data.preparation import BadRowError, prepare

    cfg = config_from_args(args)
    workers = args.workers or min(os.cpu_count() or 1, 8)
    try:
        summary = prepare(cfg, workers=workers, progress=not args.no_progress, force=args.force)
    except BadRowError as e:
        print(f"eagle-batch prepare: bad row: {e}", file=sys.stderr)
        return e.exit_code
    out_dir = os.path.join(cfg.run_dir, "prepared")
    _print_summary(summary, out_dir)
    if args.json:
        print(json.dumps(summary))
    return 0
