"""Summarise store traces (store.trace_dir) of a capture: which stage the writer waited for.

    python lab/trace_summary.py TRACE_DIR [--json]

Per trace file: the span from the first append to the last commit; the writer thread's time in append;
compression threads' busy fraction over the append span; for full hidden_states shards, the time their IO
job waited for encodes (t0 -> ready) and spent writing (ready -> t); and what was still to do after the
last append returned (encodes and shard writes that finished later).
"""

import json
import sys
from collections import defaultdict
from pathlib import Path


def summarise(events: list[dict]) -> dict:
    by = defaultdict(list)
    for e in events:
        by[e["ev"]].append(e)
    appends, encodes, shards, commits, gil = by["append"], by["encode"], by["shard"], by["commit"], by["gil"]
    start = min(e["t0"] for e in appends)
    last_append = max(e["t"] for e in appends)
    end = max(e["t"] for e in commits) if commits else max(e["t"] for e in events)
    span = last_append - start
    enc_threads = {e["thread"] for e in encodes}
    enc_busy = sum(min(e["t"], last_append) - max(e["t0"], start) for e in encodes if e["t0"] < last_append)
    full = [e for e in shards if e["array"] == "hidden_states" and e.get("full")]
    io_threads = {e["thread"] for e in full}
    wait = sum(e["ready"] - e["t0"] for e in full)
    write = sum(e["t"] - e["ready"] for e in full)
    written = sum(e.get("nbytes") or 0 for e in full)
    hs_enc = [e for e in encodes if e["array"] == "hidden_states"]
    enc_s = sorted(e["t"] - e["t0"] for e in hs_enc)
    busy_gil = [g for g in gil if start <= g["t0"] <= end]
    return {
        "span_s": round(end - start, 3),
        "append_span_s": round(span, 3),
        "drain_after_last_append_s": round(end - last_append, 3),
        "append_busy_s": round(sum(e["t"] - e["t0"] for e in appends), 3),
        "encode_threads": len(enc_threads),
        "encode_busy_frac": round(enc_busy / max(span * len(enc_threads), 1e-9), 3),
        "encodes_after_last_append": sum(e["t"] > last_append for e in encodes),
        "io_threads": len(io_threads),
        "full_shards": len(full),
        "shard_wait_for_encodes_s": round(wait, 3),
        "shard_write_s": round(write, 3),
        "shard_write_gb_s_per_thread": round(written / max(write, 1e-9) / 1e9, 3),
        "shards_after_last_append": sum(e["t"] > last_append for e in full),
        "hs_encode_ms_p50_p90_max": [round(1e3 * enc_s[int(q * (len(enc_s) - 1))], 2) for q in (0.5, 0.9, 1.0)]
        if enc_s
        else None,
        "hs_encode_gb_s_per_thread": round(sum(e["nbytes"] for e in hs_enc) / max(sum(enc_s), 1e-9) / 1e9, 3),
        "gil_late_ms_mean": round(
            sum(g["late_ms"] * g["n"] for g in busy_gil) / max(sum(g["n"] for g in busy_gil), 1), 3
        ),
        "gil_late_ms_max": round(max((g["late_max_ms"] for g in busy_gil), default=0.0), 2),
        "commit_s": [round(e["t"] - e["t0"], 3) for e in commits],
    }


def main() -> None:
    out = {}
    for f in sorted(Path(sys.argv[1]).glob("*.jsonl")):
        out[f.name] = summarise([json.loads(line) for line in f.read_text().splitlines()])
    print(json.dumps(out, indent=None if "--json" in sys.argv else 1))


if __name__ == "__main__":
    main()
