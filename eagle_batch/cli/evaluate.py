"""`eagle-batch evaluate RUN [--draft DIR] [--prompts FILE]`: serve the exported draft with vLLM and measure it.

The target (the run's model.path) generates greedily twice, alone and with the draft as its EAGLE-3
drafter (`speculative_config` method `eagle3`), each engine in its own process (evaluate/serve_check.py):
outputs must be identical, or part only where the target alone was near-tied between the two tokens
(`--tie-tolerance`; the exit status is 1 otherwise); the draft's worth is the mean acceptance length (tokens per target forward)
and the acceptance per draft position, next to the decode speed with and without it.

Prompts: `--prompts FILE`, JSON Lines with one prompt per line: a string, {"prompt": "..."}, or a chat
({"messages": [...]} / {"conversations": [...]}, cut before its first assistant turn, so a held-out
slice of the training data's format works as is); `--skip N` and `--num-prompts N` pick a slice.
Default: eight short built-in prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eagle_batch.cli.common import float_at_least, int_at_least, share_or_default
from eagle_batch.errors import UserError
from eagle_batch.evaluate.serve_check import REFERENCE_TOP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no line when each engine starts and ends")
    p.add_argument("run_dir", metavar="RUN", help="run directory (its config.yaml names the target model)")
    p.add_argument(
        "--draft",
        action="append",
        default=[],
        help="exported draft folder (repeatable: several drafts side by side against one run of the target "
        "alone); default: RUN/train/<train.name>/export",
    )
    p.add_argument("--prompts", default="", help="JSON Lines file of prompts (see above); default: built-in")
    p.add_argument("--skip", type=int_at_least(0), default=0, help="skip the first N prompts of --prompts")
    p.add_argument("--num-prompts", type=int_at_least(0), default=0, help="use at most N prompts (0 = all)")
    p.add_argument(
        "--k",
        type=int_at_least(1),
        nargs="+",
        default=[3],
        help="draft tokens per step (num_speculative_tokens); several: each",
    )
    p.add_argument("--max-tokens", type=int_at_least(1), default=128, help="tokens generated per prompt")
    p.add_argument(
        "--batch",
        type=int_at_least(0),
        default=0,
        help="decode at most N sequences at once (the engines' max_num_seqs; 1 = one prompt after another, "
        "the latency case); default: every prompt at once",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="run both engines with vLLM's compilation and CUDA graphs instead of eager mode: the decode "
        "speed a server gets (small targets are launch-bound when eager); each engine starts slower",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=share_or_default,
        default=0.0,
        help="the share of the GPU's memory each engine takes (default: vLLM's); lower it to evaluate "
        "beside other work on the same GPU",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=float_at_least(0.0),
        default=0.0,
        help="give each engine a KV cache of this many GiB instead of sizing it from the free memory it "
        "measures at start: evaluations started side by side on one GPU then do not count each other's "
        "memory as their own (vLLM's kv_cache_memory_bytes)",
    )
    p.add_argument(
        "--dtype",
        default="",
        choices=["bfloat16", "float16", "float32"],
        help="both engines' compute dtype (default: the run's model.dtype); float32 makes the draft's "
        "verification forward and plain decoding agree to far more digits, so near-tied greedy tokens "
        "rarely differ between them",
    )
    p.add_argument(
        "--tie-tolerance",
        type=float_at_least(0.0),
        default=None,
        help="where an output with the draft parts from the target alone's, the target's logprob gap between "
        "the two tokens up to which it counts as a near-tie of rounding, not an error (default by dtype: "
        "float32 0.05, float16 0.1, bfloat16 0.25 nats; 0: every difference fails)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", default="", help="also write the result as JSON to this file")
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="run both engines with vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1, CUDA): "
        "plain decoding and the draft's verification then round alike, so a random or "
        "undertrained target's near-tied logits cannot make greedy outputs differ; slower",
    )


def _prompt_of(obj, where: str) -> str | list[dict]:
    from eagle_batch.data.formats import BadRow, normalize_message

    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return obj["prompt"]
    turns = obj.get("messages") or obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list):
        raise UserError(
            f'{where}: not a prompt: expected a string, {{"prompt": ...}} or a chat with "messages" / "conversations"'
        )
    msgs = []
    try:
        for i, t in enumerate(turns):
            m = normalize_message(t, i, sharegpt="from" in t if isinstance(t, dict) else False)
            if m is None:
                continue
            if m["role"] == "assistant":
                break
            msgs.append(m)
    except BadRow as e:
        raise UserError(f"{where}: {e}") from None
    if not msgs or msgs[-1]["role"] != "user":
        raise UserError(f"{where}: the chat has no user turn before its first assistant turn")
    return msgs


def check_draft_folder(draft: Path, run_dir: str) -> None:
    """`draft` must hold an EAGLE-3 draft vLLM serves: eagle-batch's export (architectures
    LlamaForCausalLMEagle3) or a speculators checkpoint (speculators_model_type eagle3). A plain model
    folder passed by mistake would otherwise start the target's engine before vLLM refuses it."""
    cfg_file = draft / "config.json"
    if not cfg_file.is_file():
        raise UserError(
            f"{draft}: no exported draft (config.json); train first (`eagle-batch train CONFIG "
            f"run_dir={run_dir} --local`) or pass --draft"
        )
    try:
        conf = json.loads(cfg_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{cfg_file}: not a JSON config ({e}); export the draft again (`eagle-batch train`)") from None
    archs = conf.get("architectures") or [] if isinstance(conf, dict) else []
    speculator = conf.get("speculators_model_type") if isinstance(conf, dict) else None
    if speculator != "eagle3" and not any("eagle3" in str(a).lower() for a in archs):
        raise UserError(
            f"--draft {draft}: its config.json describes {', '.join(map(str, archs)) or 'no architecture'}, "
            "not an EAGLE-3 draft; pass the export folder of `eagle-batch train` (RUN/train/NAME/export) "
            "or a speculators EAGLE-3 checkpoint"
        )


def load_prompts(path: str, skip: int = 0, limit: int = 0) -> list[str | list[dict]]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--prompts {path}: no such file")
    out = []
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:  # a byte-order mark may open the file
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8"
                ) from None
            if not line.strip():
                continue
            if skip > 0:
                skip -= 1
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not JSON ({e.msg} at column {e.colno})") from None
            out.append(_prompt_of(obj, f"{path}:{lineno}"))
            if limit and len(out) >= limit:
                break
    if not out:
        raise UserError(f"--prompts {path}: no prompt left (after --skip)")
    return out


def run(args: argparse.Namespace) -> int:
    """Every (draft, k) pair on the same prompts; the target alone runs once and its outputs are the
    reference for all of them."""
    from eagle_batch.config import load_run_config
    from eagle_batch.evaluate.serve_check import BUILTIN_PROMPTS, measure_acceptance
    from eagle_batch.train.trainer import output_dir

    if args.batch_invariant:
        import torch

        if not torch.cuda.is_available():
            raise UserError("--batch-invariant: vLLM's batch-invariant kernels need a CUDA GPU; leave it out here")
    engine_args: dict = {"enforce_eager": False} if args.cuda_graphs else {}
    if args.gpu_memory_utilization:
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.kv_cache_gib:
        engine_args["kv_cache_memory_bytes"] = int(args.kv_cache_gib * 2**30)
    cfg = load_run_config(args.run_dir)
    drafts = [Path(d) for d in args.draft] or [output_dir(cfg) / "export"]
    for draft in drafts:
        check_draft_folder(draft, args.run_dir)
    prompts = (
        load_prompts(args.prompts, args.skip, args.num_prompts)
        if args.prompts
        else BUILTIN_PROMPTS[: args.num_prompts or None]
    )
    say = lambda line: args.no_progress or print(f"evaluate: {line}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"{len(prompts)} prompts, k={args.k}, {args.max_tokens} tokens each; target {cfg.model.path}")
    results, reference = [], None
    for draft in drafts:
        for k in args.k:
            say(f"draft {draft}, k={k}")
            r = measure_acceptance(
                cfg.model.path,
                draft,
                prompts,
                k=k,
                max_tokens=args.max_tokens,
                reference=reference,
                max_model_len=cfg.model.max_model_len,
                dtype=args.dtype or cfg.model.dtype,
                engine_env={"VLLM_BATCH_INVARIANT": "1"} if args.batch_invariant else None,
                max_num_seqs=args.batch,
                engine_args=engine_args,
                say=say,
                tie_tolerance=args.tie_tolerance,
            )
            reference = r.pop("reference")
            gen = r.get("generated_tokens", 0)
            r["target_alone_tok_s"] = round(gen / r["baseline_s"], 1) if r.get("baseline_s") else None
            r["with_draft_tok_s"] = round(gen / r["spec_s"], 1) if r.get("spec_s") else None
            r.update(target=str(cfg.model.path), draft=str(draft))
            results.append(r)
            if not args.json:
                _print_result(r, len(prompts), args.batch)
    doc = results[0] if len(results) == 1 else results
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc))
    return 0 if all(r["outputs_verified"] for r in results) else 1


def _print_result(r: dict, num_prompts: int, batch: int) -> None:
    per_pos = r.get("accepted_per_position") or []
    drafts = r.get("num_drafts") or 0
    if r.get("draft"):
        print(f"draft {r['draft']}:")
    print(f"mean acceptance length {r['mean_acceptance_length']:.3f} (k={r['k']}; 1 = the draft never helps)")
    if drafts:
        print("acceptance per position: " + ", ".join(f"{a / drafts:.3f}" for a in per_pos))
    print(
        f"identical greedy outputs: {'yes' if r['identical_outputs'] else 'NO'} "
        f"({num_prompts - len(r['mismatches'])}/{num_prompts} prompts)"
    )
    if not r["identical_outputs"]:
        print(_divergence_line(r["divergences"], r["tie_tolerance"]))
    print(
        f"decode: {r['target_alone_tok_s']} tok/s alone, {r['with_draft_tok_s']} tok/s with the draft "
        f"({r.get('generated_tokens', 0)} tokens, " + (f"batch {batch})" if batch else "all prompts at once)")
    )


def _divergence_line(divergences: list[dict], tolerance: float) -> str:
    ties = [d for d in divergences if d["near_tie"]]
    head = f"  {len(ties)} of {len(divergences)} part at a near-tie of the target alone (logprob gap <= {tolerance:g})"
    if len(ties) == len(divergences):
        return head + ": rounding of the verification forward against plain decoding, not an error"
    bad = next(d for d in divergences if not d["near_tie"])
    if bad["logprob_gap"] is not None:
        gap = f"gap {bad['logprob_gap']:.3g}"
    else:
        gap = {
            "none": "no logprobs of the target alone there",
            "ended": "one output ended first",
        }.get(bad.get("reference", ""), f"outside its top {REFERENCE_TOP}")
    return (
        head + f"; the others are errors: e.g. prompt {bad['prompt']} at token {bad['position']} "
        f"({bad['target_token']} alone, {bad['with_draft_token']} with the draft; {gap})"
    )
