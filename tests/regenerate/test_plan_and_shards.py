"""`eagle-batch regenerate` without an engine: which turns the target writes, the plan's accounting of
every input row, and the commit protocol of output shards (whole shards, never a conversation twice)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagle_batch.config import load_config
from eagle_batch.data.formats import BadRow
from eagle_batch.regenerate.plan import NothingToRegenerate, make_script, plan_regeneration, task_scripts
from eagle_batch.regenerate.shards import OUTPUT, ShardWriter, read_records
from eagle_batch.store import StoreLockedError

SYS = {"role": "system", "content": "Be brief."}
U1, A1 = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}
U2, A2 = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": "{}"}}]}
TOOL = {"role": "tool", "content": "4"}


def test_script_all_turns_writes_every_plain_assistant_turn_and_answers_a_final_user_turn():
    assert make_script([SYS, U1, A1, U2, A2], "all") == [SYS, U1, None, U2, None]
    assert make_script([SYS, U1, A1, U2], "all") == [SYS, U1, None, U2, None]  # the open question is answered
    # A tool call is kept (the tool result after it answers exactly that call); the answer after it is written.
    assert make_script([U1, CALL, TOOL, A1], "all") == [U1, CALL, TOOL, None]
    # A leading assistant turn has no prompt: it is dropped, not written.
    assert make_script([A1, U1, A2], "all") == [U1, None]


def test_script_last_turn_keeps_the_history_and_writes_only_the_last_answer():
    assert make_script([SYS, U1, A1, U2, A2], "last") == [SYS, U1, A1, U2, None]
    with pytest.raises(BadRow) as e:
        make_script([SYS, A1], "last")
    assert e.value.reason == "no_user_turn"


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _cfg(tmp_path: Path, model: Path, inputs: list[Path], *over: str):
    return load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"model.path={model}",
            f"data.inputs=[{','.join(map(str, inputs))}]",
            f"regenerate.run_dir={tmp_path / 'run' / 'regenerate'}",
            *over,
        ],
    )


def test_plan_accounts_for_every_row_and_balances_tasks(tmp_path, smollm2_path):
    good = [{"messages": [{"role": "user", "content": f"Question {i}?"}, A1, U2]} for i in range(6)]
    rows = [
        *good,
        {"messages": [U1, A1]},
        {"messages": [U1, A2]},  # the same script as the row before: the answers are what gets written
        "{not json",
        {"messages": [SYS, A1]},  # nothing asks for an answer
        {"conversation": [U1]},  # another field name
    ]
    src = _write_jsonl(tmp_path / "chats.jsonl", rows)
    cfg = _cfg(tmp_path, smollm2_path, [src], "regenerate.num_tasks=3", "regenerate.max_tokens=16")
    s = plan_regeneration(cfg)
    assert s["rows_read"] == 11 and s["conversations"] == 7
    assert s["skipped_by_reason"] == {"duplicate": 1, "invalid_json": 1, "no_user_turn": 1, "unknown_format": 1}
    assert s["rows_read"] == s["conversations"] + s["rows_skipped"]
    run = Path(cfg.regenerate.run_dir)
    bad = [json.loads(x) for x in (run / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert sorted(b["reason"] for b in bad) == ["duplicate", "invalid_json", "no_user_turn", "unknown_format"]
    assert all(b["file"] == str(src) and "line" in b for b in bad)
    plan = json.loads((run / "prepared" / "plan.json").read_text())
    ids = [s["id"] for t in range(3) for s in task_scripts(run, t)]
    assert plan["num_tasks"] == 3 and len(ids) == len(set(ids)) == 7
    first = task_scripts(run, 0)[0]
    assert first["source_file"] == str(src.resolve()) and first["messages"].count(None) >= 1
    # Work per task: the first prompt's tokens plus max_tokens per turn to write, balanced across tasks.
    assert max(t["num_tokens"] for t in plan["tasks"]) < 1.6 * min(t["num_tokens"] for t in plan["tasks"])


def test_nothing_to_regenerate_names_the_file_and_the_key_to_set(tmp_path, smollm2_path):
    src = _write_jsonl(tmp_path / "other.jsonl", [{"dialog": [U1, A1]}] * 3)
    with pytest.raises(NothingToRegenerate) as e:
        plan_regeneration(_cfg(tmp_path, smollm2_path, [src]))
    msg = str(e.value)
    assert f"{src}: none of its 3 rows could be used" in msg
    assert "set data.messages_field=dialog" in msg
    assert not (tmp_path / "run" / "regenerate" / "prepared").exists()


def test_prompts_alone_are_conversations_to_answer(tmp_path, smollm2_path):
    # The common input of regeneration: prompts without answers (a prompt column, or Alpaca instructions).
    src = _write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "Name a colour."}, {"instruction": "Add.", "input": "2+2"}, {"prompt": "Q?", "response": "A."}],
    )
    csv_src = tmp_path / "prompts.csv"
    csv_src.write_text("prompt,system\nName a fruit.,Be brief.\n")
    cfg = _cfg(tmp_path, smollm2_path, [src, csv_src], "regenerate.max_tokens=16")
    s = plan_regeneration(cfg)
    assert s["conversations"] == 4 and s["rows_skipped"] == 0
    scripts = [x["messages"] for x in task_scripts(Path(cfg.regenerate.run_dir), 0)]
    assert sorted(scripts, key=str) == sorted(
        [
            [{"role": "user", "content": "Name a colour."}, None],
            [{"role": "user", "content": "Add.\n\n2+2"}, None],
            [{"role": "user", "content": "Q?"}, None],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}, None],
        ],
        key=str,
    )


def _shard(rows_of: list[str]) -> tuple[list[dict], list[dict], dict]:
    """(rows, failures, counts) of a shard whose conversations `rows_of` were all written."""
    rows = [{"messages": [U1, {"role": "assistant", "content": i}], "provenance": {"id": i}} for i in rows_of]
    return rows, [], {"complete": len(rows), "turns_written": len(rows)}


def test_shards_commit_whole_and_recover_after_a_kill_at_each_step(tmp_path):
    run = tmp_path / "rg"
    with ShardWriter(run, 0) as w:
        rows, _, counts = _shard(["a", "b"])
        w.commit(["a", "b", "c"], rows, [{"id": "c", "reason": "too_long"}], counts)
        with pytest.raises(ValueError, match="committed already"):
            w.commit(["b"], *_shard(["b"]))
    out = run / OUTPUT
    # A kill after the rows were written but before the record (the commit point): the shard never existed.
    (out / ".task-00000-00001.jsonl.partial").write_text(json.dumps({"messages": []}) + "\n")
    # A kill after the record but before the rename: the commit stands, the rename is finished on open.
    rows, _, counts = _shard(["d"])
    (out / ".task-00000-00002.jsonl.partial").write_text(json.dumps(rows[0]) + "\n")
    rec = {"shard": "task-00000-00002.jsonl", "ids": ["d"], "failures": [], "counts": counts}
    (run / "shards" / "task-00000" / "00002.json").write_text(json.dumps(rec))
    with ShardWriter(run, 0) as w:
        assert w.committed == {"a", "b", "c", "d"}
        assert sorted(p.name for p in out.iterdir()) == ["task-00000-00000.jsonl", "task-00000-00002.jsonl"]
        assert w.next_shard == 3
    written = [
        json.loads(x)["provenance"]["id"] for p in sorted(out.glob("*.jsonl")) for x in p.read_text().splitlines()
    ]
    assert written == ["a", "b", "d"]
    assert [r["ids"] for r in read_records(run)] == [["a", "b", "c"], ["d"]]


def test_a_second_writer_of_the_same_task_is_refused(tmp_path):
    with ShardWriter(tmp_path / "rg", 0):
        with pytest.raises(StoreLockedError):
            ShardWriter(tmp_path / "rg", 0)
        ShardWriter(tmp_path / "rg", 1).close()  # another task's shards are another writer's


def test_a_record_whose_rows_are_gone_is_an_error_that_says_what_to_do(tmp_path):
    run = tmp_path / "rg"
    with ShardWriter(run, 0) as w:
        w.commit(["a"], *_shard(["a"]))
    os.remove(run / OUTPUT / "task-00000-00000.jsonl")
    with pytest.raises(RuntimeError, match="restore the file or delete the record to regenerate it"):
        ShardWriter(run, 0)
