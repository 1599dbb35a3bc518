"""benchmarks/results.tsv is the one table of measured figures that docs quote; these checks keep it usable.

- Its header is exactly `metric value unit date hardware commit command raw` (tab-separated), every row has
  those eight fields, a numeric value, an ISO date, a commit id and the command that reproduces the figure.
- Every `raw` path exists in the repository (`-` where no raw output was kept for a figure).
- No file or folder under docs/ or benchmarks/ is named after when or in which run it was made (a numbered
  run or attempt, a date): names say what was measured and where.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "benchmarks" / "results.tsv"
HEADER = ["metric", "value", "unit", "date", "hardware", "commit", "command", "raw"]
# s10, session3, first-try, run2, attempt-1: names that say when or in which run a file was made.
DIARY_NAME = re.compile(r"(?:^|[^a-z0-9])s\d+(?:$|[^a-z0-9])|session|first-try|run-?\d|attempt-?\d|\d{4}-\d{2}-\d{2}")


def rows() -> list[dict[str, str]]:
    with TABLE.open(newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        assert reader.fieldnames == HEADER, f"{TABLE}: header {reader.fieldnames}, expected {HEADER}"
        return list(reader)


def test_results_table_columns():
    table = rows()
    assert len(table) >= 20, "the table holds the docs' current figures"
    metrics = [r["metric"] for r in table]
    assert len(set(metrics)) == len(metrics), "each metric appears once (the current figure)"
    for i, r in enumerate(table, start=2):
        where = f"{TABLE.name} line {i} ({r['metric']})"
        assert None not in r and all(r[k] for k in HEADER), f"{where}: every field is filled"
        float(r["value"])  # raises on a non-number
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), f"{where}: date {r['date']!r} is not YYYY-MM-DD"
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]), f"{where}: commit {r['commit']!r}"
        assert len(r["command"].split()) >= 2, f"{where}: the command that reproduces the figure"


def test_results_table_raw_paths_exist():
    for r in rows():
        if r["raw"] != "-":
            assert (REPO / r["raw"]).is_file(), f"{TABLE.name}: {r['metric']}: raw output {r['raw']} is missing"


def test_no_docs_or_benchmarks_named_after_a_run():
    bad = [
        str(p.relative_to(REPO))
        for top in ("docs", "benchmarks")
        for p in (REPO / top).rglob("*")
        if DIARY_NAME.search(p.name.lower())
    ]
    assert not bad, f"named after a run or a date (name what and where instead): {bad}"


def test_diary_name_pattern():
    for name in ("draft-quality-s10", "bench-capture-durable-session3.json", "validate-tp1-first-try.json", "run2"):
        assert DIARY_NAME.search(name), name
    for name in ("evaluate-regen-k3.json", "step-sim.json", "results.tsv", "0011-commit-protocol-and-fsync.md"):
        assert not DIARY_NAME.search(name), name
