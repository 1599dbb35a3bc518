"""RUN/report.html: one page that says what ran, what came out, where it is, and what each number means.

    from eagle_batch.report import write_report
    write_report(run_dir, summary, train_dir, evaluation=acc, baseline=untrained_acc)

Everything is read from the run directory (config.yaml, prepared/summary.json, the task states, the stores,
the training metrics) plus the evaluation results handed in (`evaluate.serve_check.measure_acceptance`'s dicts).
The page is self-contained (plots inlined as PNG) and links the outputs by relative paths, so it can be
opened from the run directory on any machine.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}table{border-collapse:collapse;margin:.6em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.num{text-align:right;font-variant-numeric:tabular-nums}.note{color:#555;font-size:.92em}
figure{margin:1em 0}figcaption{color:#555;font-size:.92em;max-width:48em}code{background:#f4f4f4;padding:0 .2em}"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# The run summary's keys (demo-summary.json, the report's Numbers table): unit, and what the number means.
SUMMARY_FIELDS: dict[str, tuple[str, str]] = {
    "executor": ("", "where the extraction tasks ran: slurm (a Slurm array) or local (submitit's local executor)"),
    "tasks": ("", "extraction tasks, each with its own vLLM engine writing its own task store"),
    "conversations_kept": (
        "",
        "conversations prepare kept from the data (the rest are counted by reason in prepared/summary.json)",
    ),
    "samples": (
        "",
        "samples stored: one per conversation (one per assistant turn where the chat template rewrites earlier turns)",
    ),
    "tokens": ("tokens", "tokens stored: every token of every sample, prompt and answers"),
    "capture_tokens_per_s": (
        "tokens/s",
        "capture tok/s: tokens stored / the wall time of the extraction "
        "tasks' attempts, engine start-ups included (the steady rate is in the plot below)",
    ),
    "bytes_per_token": ("bytes", "bytes on disk per token for all captured layers (raw bf16: layers x hidden x 2)"),
    "compression_ratio": ("x", "raw bf16 bytes / bytes on disk (lossless for store.dtype bfloat16)"),
    "train_steps": ("steps", "optimizer steps the draft trained"),
    "train_step_s": ("s", "mean wall time of one training step (waiting for data included, checkpoint saves not)"),
    "training_tokens_per_s": ("tokens/s", "training tok/s: tokens through the draft per second, over the run"),
    "train_time_acceptance_length": (
        "tokens",
        'the training log\'s "train-time accept": the acceptance length '
        "estimated on the last training batches, where the draft continues the "
        "data's own answers (teacher-forced) that it was fitted on; above the served "
        "figure, by far for a draft trained briefly on little data",
    ),
    "acceptance_length": (
        "tokens per target forward",
        "served: mean acceptance length, tokens the target keeps "
        "per forward pass with the draft, on new prompts it answers greedily (1.0 = the draft "
        "never helps; k+1 at best)",
    ),
    "untrained_acceptance_length": (
        "tokens per target forward",
        "the same for the untrained draft: the floor the training must beat",
    ),
    "identical_outputs": ("", "greedy outputs with the draft equal the target alone's (they must)"),
    "k": ("draft tokens", "draft tokens proposed per step when serving (num_speculative_tokens)"),
    "wall_s": ("s", "the whole run's wall time, from materializing the model to this report"),
}


def training_figures(train_dir: Path) -> dict[str, float]:
    """From metrics.jsonl: mean seconds per step, training tok/s over the run, and the last train-time
    acceptance estimate (empty where no step was logged)."""
    path = Path(train_dir) / "metrics.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    recs = [r for r in recs if "step_s" in r and "tokens_per_s" in r]
    if not recs:
        return {}
    seconds = sum(r["step_s"] * r.get("steps_in_window", 1) for r in recs)
    steps = sum(r.get("steps_in_window", 1) for r in recs)
    tokens = sum(r["tokens_per_s"] * r["step_s"] * r.get("steps_in_window", 1) for r in recs)
    return {
        "train_step_s": round(seconds / max(steps, 1), 3),
        "training_tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        "train_time_acceptance_length": round(recs[-1].get("expected_acceptance_length", 0.0), 3),
    }


def store_bytes(run_dir: Path) -> tuple[int, int]:
    """(bytes of hidden_states on disk, raw bf16 bytes they hold) over all task stores of an aggregated run."""
    from eagle_batch.store import open_dataset

    ds = open_dataset(run_dir)
    disk = sum(f.stat().st_size for s in ds.stores for f in (Path(s.path) / "hidden_states").rglob("*") if f.is_file())
    hidden = int(ds[0]["hidden_states"].shape[-1]) if len(ds) else 0
    return disk, int(ds.lengths().sum()) * len(ds.layer_ids) * hidden * 2


def capture_seconds(run_dir: Path, num_tasks: int) -> float:
    """Wall seconds the task attempts spent (engine start included), summed over tasks."""
    from eagle_batch.launch import read_state

    total = 0.0
    for t in range(num_tasks):
        st = read_state(run_dir, t)
        for a in st.attempts if st else []:
            total += max(0.0, (a.ended or a.started) - a.started)
    return total


# ------------------------------------------------------------------------------------------------ plots
def _plots(run_dir: Path, num_tasks: int, train_dir: Path) -> list[tuple[str, str, str]]:
    """(title, caption, png) for throughput per task, sample lengths and the training loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from eagle_batch.launch import read_state
    from eagle_batch.store import open_dataset

    out = []
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for t in range(num_tasks):
        st = read_state(run_dir, t)
        hist = (st.extra.get("history") if st else None) or []
        if len(hist) >= 2:
            ts = np.array([h[0] for h in hist]) - hist[0][0]
            tok = np.array([h[1] for h in hist], dtype=float)
            rate = np.diff(tok) / np.maximum(np.diff(ts), 1e-6)
            ax.step(ts[1:], rate, where="pre", marker=".", label=f"task {t}")  # marker: one interval shows too
    ax.set_xlabel("seconds since the task started")
    ax.set_ylabel("tokens/s committed")
    ax.set_title("capture throughput per task")
    if ax.lines:  # no task committed twice (nothing to plot): no empty legend
        ax.legend(fontsize=7)
    out.append(
        (
            "Capture throughput per task",
            "Tokens committed per second between two commits of each extraction task, from the moment its "
            "attempt started: the first interval includes the engine's start-up, so it is low; the level "
            "after it is the task's steady rate. A task that stops and resumes shows a gap.",
            _png(fig),
        )
    )
    plt.close(fig)

    lengths = open_dataset(run_dir).lengths()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(lengths, bins=40)
    ax.set_xlabel("tokens per sample")
    ax.set_ylabel("samples")
    ax.set_title("sample lengths")
    out.append(
        (
            "Sample lengths",
            "How long the extracted samples are (prompt and answers, in tokens, after "
            "data.max_length): what the draft trains on. Samples at the right edge were truncated.",
            _png(fig),
        )
    )
    plt.close(fig)

    recs = (
        [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        if (train_dir / "metrics.jsonl").is_file()
        else []
    )
    recs = [r for r in recs if "loss" in r]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([r["step"] for r in recs], [r["loss"] for r in recs], label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("draft training loss")
    out.append(
        (
            "Draft training loss",
            "The draft's training loss per logged step: cross-entropy against the "
            "target's next-token distribution, summed over the training-time-test steps (each later step "
            "predicts from the draft's own earlier guesses). It should fall and flatten.",
            _png(fig),
        )
    )
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------- page
def _table(rows: list[tuple], head: tuple | None = None) -> str:
    def cell(v, tag="td"):
        cls = " class='num'" if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
        return f"<{tag}{cls}>{v if isinstance(v, _Raw) else html.escape(str(v))}</{tag}>"

    h = "<tr>" + "".join(cell(x, "th") for x in head) + "</tr>" if head else ""
    return "<table>" + h + "".join("<tr>" + "".join(cell(x) for x in r) + "</tr>" for r in rows) + "</table>"


class _Raw(str):
    """Already-escaped HTML inside a table cell (a link)."""


def _link(run_dir: Path, path: Path, label: str = "") -> _Raw:
    try:
        href = path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        href = path.resolve().as_uri()
    return _Raw(f"<a href='{html.escape(href)}'>{html.escape(label or href)}</a>")


def _outputs_cell(r: dict) -> str:
    if r.get("identical_outputs"):
        return "yes"
    n = len(r.get("mismatches", []))
    return f"{n} differ, at near-ties only" if r.get("outputs_verified") else f"NO ({n} differ)"


def _acceptance_rows(evaluation: dict | None, baseline: dict | None) -> list[tuple]:
    rows = []
    for name, r in (("trained draft", evaluation), ("untrained draft (same shape, initial weights)", baseline)):
        if not r or not r.get("num_drafts"):
            continue
        per = [a / r["num_drafts"] for a in r.get("accepted_per_position") or []]
        rows.append(
            (
                name,
                round(r["mean_acceptance_length"], 3),
                *(f"{p:.3f}" for p in per),
                _outputs_cell(r),
            )
        )
    return rows


def _outputs(run_dir: Path, train_dir: Path) -> list[tuple]:
    items = [
        ("the resolved config", run_dir / "config.yaml"),
        ("prepare's summary (rows read, kept, skipped by reason)", run_dir / "prepared" / "summary.json"),
        ("skipped rows, each with file and line", run_dir / "prepared" / "bad_rows.jsonl"),
        ("the index over all task stores (open with eagle_batch.store.open_dataset)", run_dir / "dataset.json"),
        ("training metrics, one JSON line per logged step", train_dir / "metrics.jsonl"),
        ("the exported draft (vLLM: speculative_config method eagle3, model=this folder)", train_dir / "export"),
    ]
    rows = [(what, _link(run_dir, p)) for what, p in items if p.exists()]
    for store in sorted((run_dir / "stores").glob("task-*.zarr")):
        rows.append((f"task store {store.stem[5:]} (Zarr: hidden_states, input_ids, loss_mask)", _link(run_dir, store)))
    for log in sorted((run_dir / "slurm").glob("**/task-*.log")) + sorted((run_dir / "slurm").glob("*_*/*_log.err")):
        rows.append(("a task's log", _link(run_dir, log)))
    return rows


def _prepared_counts(prep: dict) -> str:
    skipped = prep.get("skipped_by_reason") or {}
    return (
        f" ({prep.get('rows_read')} rows read, {prep.get('rows_kept')} kept, {prep.get('rows_skipped')} skipped"
        + (": " + html.escape(", ".join(f"{k} {v}" for k, v in skipped.items())) if skipped else "")
        + ")"
    )


def write_report(
    run_dir: Path,
    summary: dict,
    train_dir: Path,
    evaluation: dict | None = None,
    baseline: dict | None = None,
    title: str = "eagle-batch run",
) -> Path:
    """Write RUN/report.html for a run whose stores are aggregated; `summary` holds the headline numbers."""
    from eagle_batch.config import load_run_config

    run_dir, train_dir = Path(run_dir), Path(train_dir)
    try:
        cfg = load_run_config(run_dir)
        model, inputs, executor = cfg.model.name or cfg.model.path, ", ".join(cfg.data.inputs), cfg.slurm.executor
    except Exception:  # noqa: BLE001 - a report of a run without config.yaml still shows its numbers
        model = inputs = executor = "?"
    prep = _read_json(run_dir / "prepared" / "summary.json") or {}
    parts = [
        f"<h1>{html.escape(title)}</h1><p class='note'>{html.escape(str(run_dir))}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}</p>",
        "<h2>What ran</h2><p>"
        f"Target <b>{html.escape(str(model))}</b>" + (f"; data {html.escape(inputs)}" if inputs else "") + ". "
        "<b>prepare</b> rendered each chat with the target's own chat template into token ids and an "
        "assistant-only loss mask" + (_prepared_counts(prep) if prep else "") + "; "
        f"<b>extract</b> ran {summary.get('tasks', '?')} task(s) (executor: {html.escape(str(summary.get('executor', executor)))}), "
        "each starting vLLM and committing the target's hidden states into a compressed Zarr task store; "
        "<b>aggregate</b> and <b>verify</b> indexed the stores and re-checked every checksum; <b>train</b> "
        "fitted an EAGLE-3 draft on the stored states; <b>evaluate</b> served the target with and without "
        "the draft in vLLM, greedily, and compared.</p>",
    ]
    rows = [(k, v, *SUMMARY_FIELDS.get(k, ("", ""))) for k, v in summary.items()]
    parts.append("<h2>Numbers</h2>" + _table(rows, ("", "value", "unit", "what it means")))
    acc_rows = _acceptance_rows(evaluation, baseline)
    if acc_rows:
        k = len((evaluation or baseline).get("accepted_per_position") or [])
        parts.append(
            "<h2>Acceptance per draft position</h2><p>For each of the k draft tokens proposed per step, "
            "the fraction of steps in which it was accepted (position 1 first; a position is reached only "
            "if all before it were accepted).</p>"
            + _table(
                acc_rows, ("draft", "mean acceptance length", *(f"pos {i + 1}" for i in range(k)), "identical outputs")
            )
        )
    for name, caption, png in _plots(run_dir, int(summary.get("tasks", 0) or 0), train_dir):
        parts.append(
            f"<h2>{html.escape(name)}</h2><figure><img src='data:image/png;base64,{png}' "
            f"alt='{html.escape(name)}'/><figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    parts.append("<h2>Outputs</h2>" + _table(_outputs(run_dir, train_dir), ("what", "where")))
    out = run_dir / "report.html"
    out.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>"
    )
    return out
