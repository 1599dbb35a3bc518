"""data.inputs -> the regeneration plan: which turns of which conversation the target writes, per task.

Each usable row becomes a *script*: its messages with `None` where the target writes an assistant turn
(`regenerate.turns`): `all` puts `None` in place of every assistant turn without tool calls (a turn with
tool calls is kept, since the tool results after it answer exactly those calls) and after a final user or
tool turn; `last` keeps the conversation up to its last user turn and puts one `None` after it. Messages
after the last `None` are dropped (nothing answers them). Rows that cannot be read, or have nothing to
answer, are counted by reason and listed in bad_rows.jsonl, as in prepare; identical scripts are
regenerated once.

Files (RUN/regenerate/prepared/): `task-TTTTT.jsonl` (the task's scripts in order, with their source file
and row), `plan.json` ({num_tasks, tasks: [{task_id, num_samples, num_tokens, rows}]}: work balanced by
the first prompt's tokens plus max_tokens per turn to write), `bad_rows.jsonl`, `summary.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from eagle_batch.config import ConfigError, RunConfig, save_config
from eagle_batch.config.load import PLANNED_NAME
from eagle_batch.data.formats import BadRow, row_to_conversation
from eagle_batch.data.plan import plan_lpt
from eagle_batch.data.readers import decode_record, iter_records, resolve_inputs
from eagle_batch.data.streaming import ReadLimits
from eagle_batch.data.tally import SHAPE_REASONS, FileTally, file_warnings, reasons_text
from eagle_batch.data.template import prompt_ids
from eagle_batch.errors import UserError

PREPARED = "prepared"
PLAN = "plan.json"
SUMMARY = "summary.json"
BAD_ROWS = "bad_rows.jsonl"


class NothingToRegenerate(UserError):
    """No row of the inputs has a turn for the target to write."""


def regenerate_dir(cfg: RunConfig) -> Path:
    return Path(cfg.regenerate.run_dir) if cfg.regenerate.run_dir else Path(cfg.run_dir) / "regenerate"


def template_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """What the chat template is rendered with, here and when prepare later reads the output."""
    kw = cfg.regenerate.chat_template_kwargs
    return dict(cfg.data.chat_template_kwargs if kw is None else kw)


def make_script(messages: list[dict], turns: str) -> list[dict | None]:
    """Messages with None where the target writes an assistant turn (see the module docstring)."""
    if turns == "last":
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise BadRow("no_user_turn", "no user turn to answer")
        return [*messages[: users[-1] + 1], None]
    if not any(m["role"] == "user" for m in messages):
        raise BadRow("no_user_turn", "no user turn to answer")
    script: list[dict | None] = [None if m["role"] == "assistant" and not m.get("tool_calls") else m for m in messages]
    if script and script[-1] is not None and script[-1]["role"] in ("user", "tool"):
        script.append(None)
    while script and script[-1] is not None:  # nothing after the last turn to write answers it
        script.pop()
    if not script or script[0] is None:  # an assistant turn first: nothing prompts it
        script = script[1:] if script else script
    if None not in script:
        raise BadRow("no_user_turn", "no assistant turn to write after a user turn")
    return script


def script_id(script: list, tools) -> str:
    return hashlib.blake2b(json.dumps([script, tools], sort_keys=True).encode(), digest_size=10).hexdigest()


def _first_prompt_tokens(tok, script: list, tools, kwargs: dict) -> int:
    first = script[: script.index(None)]
    kw = dict(kwargs, tools=tools) if tools else kwargs
    try:
        return len(prompt_ids(tok, first, **kw))
    except Exception as e:  # jinja raise_exception(), TypeError from str + None, ...
        raise BadRow("template_error", f"chat template failed: {type(e).__name__}: {e}") from None


def plan_regeneration(cfg: RunConfig, tokenizer=None) -> dict:
    """Read data.inputs, write RUN/regenerate/prepared/ and RUN/regenerate/config.yaml; return the summary."""
    from eagle_batch.config import check_values
    from eagle_batch.data.rows import load_tokenizer

    check_values(cfg)
    rg, out_run = cfg.regenerate, regenerate_dir(cfg)
    files = resolve_inputs(list(cfg.data.inputs))
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    kwargs = template_kwargs(cfg)
    scripts, weights, skipped, seen = [], [], Counter(), set()
    per_file = {str(f): FileTally() for f in files}
    bad_lines, examples = [], []
    rows_read = 0
    for f in files:
        ft = per_file[str(f)]
        for rec in iter_records(f, ReadLimits.from_config(cfg.data)):
            if cfg.data.limit and rows_read >= cfg.data.limit:
                break
            rows_read += 1
            ft.rows += 1
            loc = {"file": rec.file, rec.line_kind: rec.index}
            row = None
            try:
                row = decode_record(rec)
                conv = row_to_conversation(row, cfg.data, require_assistant=False)
                messages, tools = conv.messages, conv.tools
                ft.read_as(conv.format, conv.also, f"{rec.line_kind} {rec.index}")
                script = make_script(messages, rg.turns)
                n_prompt = _first_prompt_tokens(tok, script, tools, kwargs)
            except BadRow as e:
                skipped[e.reason] += 1
                ft.skipped[e.reason] += 1
                if e.reason in SHAPE_REASONS and isinstance(row, dict):
                    ft.fields.update(str(k) for k in row)
                if len(examples) < 5:
                    examples.append(f"{rec.file} {rec.line_kind} {rec.index}: {e.reason}: {e.detail}")
                bad_lines.append({**loc, "reason": e.reason, "detail": e.detail})
                continue
            ft.kept += 1
            sid = script_id(script, tools)
            if sid in seen:
                skipped["duplicate"] += 1
                bad_lines.append({**loc, "reason": "duplicate", "detail": f"the same conversation as {sid}"})
                continue
            seen.add(sid)
            weight = n_prompt + rg.max_tokens * script.count(None)
            scripts.append(
                {
                    "id": sid,
                    "source_file": str(Path(rec.file).resolve()),
                    "source_row": rec.index,
                    "messages": script,
                    "tools": tools,
                    "weight": weight,
                }
            )
            weights.append(weight)
    if not scripts:
        lines = [
            f"nothing to regenerate: no usable conversation in {len(files)} input file(s) ({rows_read} rows read"
            + (f"; skipped: {reasons_text(skipped)}" if skipped else "")
            + ")."
        ]
        lines += [f"  {w}" for w in file_warnings(per_file, cfg.data)]
        lines += ["  first bad rows:", *(f"    {e}" for e in examples)] if examples else []
        raise NothingToRegenerate("\n".join(lines))
    summary = _write(out_run, cfg, files, scripts, weights, bad_lines, rows_read, skipped)
    summary["file_warnings"] = file_warnings(per_file, cfg.data)
    return summary


def _write(out_run: Path, cfg: RunConfig, files, scripts, weights, bad_lines, rows_read, skipped) -> dict:
    if (out_run / "output").is_dir() and any((out_run / "output").iterdir()):
        raise ConfigError(
            f"{out_run} already has regenerated output; planning again would change which "
            "conversations each task holds. Use a new regenerate.run_dir, or `eagle-batch resume "
            f"{out_run}` to finish the existing one."
        )
    tmp = out_run / f".{PREPARED}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(f"regenerate.run_dir={out_run}: cannot create it ({e.strerror})") from None
    tasks = plan_lpt(weights, cfg.regenerate.num_tasks)
    plan = {"num_tasks": len(tasks), "tasks": []}
    for t, rows in enumerate(tasks):
        with open(tmp / f"task-{t:05d}.jsonl", "w") as f:
            for i in rows:
                f.write(json.dumps(scripts[i]) + "\n")
        plan["tasks"].append(
            {"task_id": t, "rows": rows, "num_samples": len(rows), "num_tokens": int(sum(weights[i] for i in rows))}
        )
    (tmp / PLAN).write_text(json.dumps(plan) + "\n")
    (tmp / BAD_ROWS).write_text("".join(json.dumps(b) + "\n" for b in bad_lines))
    summary = {
        "inputs": [str(Path(f).resolve()) for f in files],
        "rows_read": rows_read,
        "conversations": len(scripts),
        "turns_to_write": sum(s["messages"].count(None) for s in scripts),
        "rows_skipped": sum(skipped.values()),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "tasks": len(tasks),
    }
    (tmp / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    save_config(cfg, tmp, name=PLANNED_NAME)  # what resume compares RUN/config.yaml with
    final = out_run / PREPARED
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    save_config(cfg, out_run)
    return summary


def task_scripts(run_dir: str | os.PathLike, task_id: int) -> list[dict]:
    path = Path(run_dir) / PREPARED / f"task-{task_id:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
