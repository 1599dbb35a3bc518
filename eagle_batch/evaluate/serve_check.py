"""Serve an exported draft with vLLM as the EAGLE-3 drafter and measure what it buys.

    from eagle_batch.evaluate.serve_check import measure_acceptance
    r = measure_acceptance(target_path, draft_dir, prompts, k=3)
    r["mean_acceptance_length"], r["identical_outputs"]

Each engine (plain target, target + draft) runs in its own Python subprocess: vLLM engines do not
fully release their distributed state / memory when deleted, and only one engine may exist at a time on
the shared CPU box. Greedy decoding in both; `identical_outputs` compares the generated token ids.

Where the outputs differ, `divergences` says where each prompt's two outputs part and how close the target
alone was to the token the run with the draft chose there: a run with the draft emits the target's argmax
from a (k+1)-token verification forward, plain decoding from a one-token step, and the two round
differently, so where the target's top two tokens are closer than that rounding either may win. A
divergence within TIE_TOLERANCE is such a near-tie (`outputs_verified`); one beyond it means the run with
the draft did not emit what the target would have. The target's logprobs there come from scoring the
plain output: one untimed prefill of prompt + output in the plain engine (`prompt_logprobs`), so they are
the target's at exactly the context both runs shared up to where they part, at every generated position.
(A second decoding pass would not do: on a target with many near-ties, a random-weight one above all, it
parts from the first pass itself and leaves the later positions without logprobs.)

Mean acceptance length = 1 + accepted draft tokens / drafts (the tokens each target forward yields,
the number EAGLE papers report), from vLLM's spec-decode counters (`llm.get_metrics()`:
`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle_batch import environment
from eagle_batch.errors import UserError
from eagle_batch.ownership import user_temp_dir

# Short, varied prompts for a quick look at a draft (the demo, `eagle-batch evaluate` without --prompts);
# a real evaluation uses held-out prompts of the user's own data.
BUILTIN_PROMPTS = [
    "Explain what a hash table is and when to use one.",
    "Write a short poem about autumn leaves.",
    "How do I reverse a list in Python?",
    "What are three tips for better sleep?",
    "Summarize the water cycle in a few sentences.",
    "What is the difference between a virus and a bacterium?",
    "Give me a recipe for a simple tomato pasta.",
    "How does compound interest work?",
]


# Near-tie tolerance in nats per compute dtype: above what rounding moves a logit gap by in that dtype, far
# below a real preference of the target (0.05 nats: 51% against 49%). bfloat16 keeps 8 bits of mantissa
# (~0.1 at a logit of 20), float16 10. In float32 the gaps where outputs parted on the H200 were 0.0009,
# 0.0017 and 0.0065 (SmolLM2-135M, 80 prompts: docs/explanation/training.md, "Serving check"), 30 layers of differently
# ordered reductions apart.
TIE_TOLERANCE = {"float32": 0.05, "float16": 0.1, "bfloat16": 0.25}
REFERENCE_TOP = 5  # the target's top logprobs kept per generated position (and the generated token's own)


def divergence(prompt: int, target: list[int], top: list, with_draft: list[int], tolerance: float) -> dict:
    """Where one prompt's two greedy outputs part: the position, both tokens, and the target's logprob gap
    between them there (from the scored plain output's top-REFERENCE_TOP; None when the run with the draft
    chose a token outside it, when one output ended first, or when there are no logprobs for that position:
    `reference` says which)."""
    j = next((i for i, (a, b) in enumerate(zip(target, with_draft)) if a != b), min(len(target), len(with_draft)))
    gap, reference = None, "ended"
    if j < min(len(target), len(with_draft)):
        reference = "none"
        if j < len(top):
            logprobs = {int(t): lp for t, lp in top[j]}
            reference = f"top{REFERENCE_TOP}"
            if target[j] in logprobs and with_draft[j] in logprobs:
                gap = logprobs[target[j]] - logprobs[with_draft[j]]
    return {
        "prompt": prompt,
        "position": j,
        "target_token": target[j] if j < len(target) else None,
        "with_draft_token": with_draft[j] if j < len(with_draft) else None,
        "logprob_gap": gap,
        "reference": reference,  # top<n>: the target's top-n logprobs there; none: no logprobs; ended
        "near_tie": gap is not None and gap <= tolerance,
    }


def _engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = environment.child_environment(extra)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The package must be importable by the child even when it is not installed.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def servable_target(target_path: str | os.PathLike, dest: str | os.PathLike | None = None) -> Path:
    """`target_path`, or a view of it that vLLM loads when its config.json carries a GGUF loader's
    `quantization_config` over plain safetensors weights (what transformers writes after loading a GGUF
    file, as `eagle_batch.models.smollm2.materialize()` does; vLLM 0.32 rejects "quantization method:
    gguf"). The view symlinks every file and rewrites config.json without that key."""
    src = Path(target_path)
    raw = json.loads((src / "config.json").read_text())
    q = raw.get("quantization_config")
    if not (isinstance(q, dict) and q.get("quant_method") == "gguf" and list(src.glob("*.safetensors"))):
        return src
    # Without `dest`: this user's own 0700 temp folder (a fixed name in the shared temp folder could be
    # another user's, links planted to write through).
    dest = Path(dest) if dest else user_temp_dir(f"servable-{src.name}")
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = dest / f.name
        if f.name in ("config.json", ".complete") or link.exists() or link.is_symlink():
            continue
        link.symlink_to(f.resolve())
    raw.pop("quantization_config")
    tmp = dest / "config.json.tmp"
    tmp.write_text(json.dumps(raw, indent=2))
    os.replace(tmp, dest / "config.json")
    return dest


def _run_engine(spec: dict, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="eagle-serve-") as d:
        inp, out = Path(d) / "in.json", Path(d) / "out.json"
        inp.write_text(json.dumps(spec))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "eagle_batch.evaluate.serve_check", str(inp), str(out)],
                env=_engine_env(env),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as e:  # the machine, not the input: one line, no traceback
            what = f"the draft {spec['draft']}" if spec.get("draft") else "the target alone"
            said = (e.stderr or b"")[-300:]
            said = said.decode(errors="replace") if isinstance(said, bytes) else said
            raise UserError(
                f"the vLLM engine serving {what} did not finish in {timeout_s:.0f} s and was stopped (a machine "
                f"loaded by other work, or an engine that hung); run the command again on a less loaded machine. "
                f"Its last output: {said.strip().splitlines()[-1] if said.strip() else '(none)'}",
                1,
            ) from None
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
            raise RuntimeError(f"vLLM engine subprocess failed (rc={proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def _timed(say: Callable[[str], None] | None, what: str, spec: dict, timeout_s: float, env) -> dict:
    """One engine run, announced: start-up alone takes a minute or more, and nothing else shows meanwhile."""
    t0 = time.monotonic()
    if say:
        say(f"{what}: starting a vLLM engine")
    out = _run_engine(spec, timeout_s, env)
    if say:
        say(f"{what}: done in {time.monotonic() - t0:.0f} s (generation {out['elapsed_s']:.1f} s)")
    return out


def render_prompts(target_path: str | os.PathLike, prompts: Sequence[str | list[dict]]) -> list[list[int]]:
    """Plain strings and message lists both go through the target's chat template (generation prompt on)."""
    from transformers import AutoTokenizer

    from eagle_batch.data.template import prompt_ids

    tok = AutoTokenizer.from_pretrained(str(target_path))
    return [prompt_ids(tok, [{"role": "user", "content": p}] if isinstance(p, str) else list(p)) for p in prompts]


def measure_acceptance(
    target_path: str | os.PathLike,
    draft_dir: str | os.PathLike | None,
    prompts: Sequence[str | list[dict]],
    k: int = 3,
    max_tokens: int = 64,
    reference: dict | None = None,
    timeout_s: float = 900.0,
    max_model_len: int = 2048,
    dtype: str = "auto",
    engine_env: dict[str, str] | None = None,
    say: Callable[[str], None] | None = None,
    max_num_seqs: int = 0,
    engine_args: dict[str, Any] | None = None,
    tie_tolerance: float | None = None,
) -> dict[str, Any]:
    """Greedy-generate `prompts` with and without the EAGLE-3 draft in `draft_dir`.

    Returns mean_acceptance_length, identical_outputs, num_drafts, num_draft_tokens,
    num_accepted_tokens, accepted_per_position, acceptance_rate, mismatches (prompt indexes), divergences
    (where each mismatch starts, see above), outputs_verified (identical, or every divergence a near-tie
    within `tie_tolerance` nats; default TIE_TOLERANCE of the dtype), timings,
    and `reference` (the no-speculation outputs; pass it back in to skip re-running the plain engine).
    dtype: the engines' compute dtype; "auto" = bfloat16 on a GPU, float32 on a CPU (CPUs without
    AVX512-BF16/AMX run bf16 several times slower; both engines use the same dtype either way).
    engine_args: more vllm.LLM arguments for both engines (e.g. gpu_memory_utilization, enforce_eager=False);
    they win over the defaults here (eager, vLLM's memory share).
    """
    if dtype == "auto":
        import torch

        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    target_path = servable_target(target_path)
    prompt_ids = render_prompts(target_path, prompts)
    common = dict(
        target=str(target_path),
        prompts=prompt_ids,
        max_tokens=max_tokens,
        max_model_len=max_model_len,
        dtype=dtype,
        max_num_seqs=int(max_num_seqs),
        engine_args=dict(engine_args or {}),
    )
    work = f"{len(prompt_ids)} prompts x {max_tokens} tokens, greedy"
    if reference is None:
        reference = _timed(say, f"the target alone ({work})", dict(common, draft=None, k=0), timeout_s, engine_env)
    spec = None
    if draft_dir:
        spec = _timed(
            say,
            f"the target with the draft, k={k}",
            dict(common, draft=str(draft_dir), k=int(k)),
            timeout_s,
            engine_env,
        )
    result: dict[str, Any] = {
        "k": k,
        "batch": int(max_num_seqs) or len(prompt_ids),
        "num_prompts": len(prompt_ids),
        "max_tokens": max_tokens,
        "reference": reference,
        "baseline_s": reference["elapsed_s"],
    }
    if spec is None:
        return result
    tol = TIE_TOLERANCE.get(dtype, TIE_TOLERANCE["bfloat16"]) if tie_tolerance is None else tie_tolerance
    result.update(_compare(reference, spec, tol))
    return result


def _compare(reference: dict, spec: dict, tol: float) -> dict[str, Any]:
    """The run with the draft against the plain one: spec-decode counters and where the outputs part."""
    mismatches = [i for i, (a, b) in enumerate(zip(reference["outputs"], spec["outputs"])) if a != b]
    tops = reference.get("top") or [[] for _ in reference["outputs"]]
    divergences = [divergence(i, reference["outputs"][i], tops[i], spec["outputs"][i], tol) for i in mismatches]
    m = spec["metrics"]
    drafts = m.get("vllm:spec_decode_num_drafts", 0)
    accepted = m.get("vllm:spec_decode_num_accepted_tokens", 0)
    draft_tokens = m.get("vllm:spec_decode_num_draft_tokens", 0)
    same_count = len(reference["outputs"]) == len(spec["outputs"])
    return dict(
        mean_acceptance_length=(1.0 + accepted / drafts) if drafts else float("nan"),
        acceptance_rate=(accepted / draft_tokens) if draft_tokens else float("nan"),
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_position=m.get("vllm:spec_decode_num_accepted_tokens_per_pos", []),
        identical_outputs=not mismatches and same_count,
        mismatches=mismatches,
        divergences=divergences,
        tie_tolerance=tol,
        outputs_verified=same_count and all(d["near_tie"] for d in divergences),
        spec_s=spec["elapsed_s"],
        generated_tokens=sum(len(o) for o in spec["outputs"]),
    )


def _engine_main(inp: Path, out: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle_batch.capture.vllm_compat import cpu_mla_engine_args, quiet_expected_warnings
    from eagle_batch.config import model_info

    quiet_expected_warnings()

    spec = json.loads(inp.read_text())
    kwargs: dict[str, Any] = dict(
        model=spec["target"],
        dtype=spec.get("dtype", "bfloat16"),
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
    )
    if spec.get("max_num_seqs"):
        kwargs["max_num_seqs"] = int(spec["max_num_seqs"])
    kwargs.update(spec.get("engine_args") or {})
    kwargs.update(cpu_mla_engine_args(model_info(spec["target"]).uses_mla, kwargs["dtype"]))
    if spec.get("draft"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": spec["draft"], "num_speculative_tokens": spec["k"]}
    llm = LLM(**kwargs)
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    t0 = time.perf_counter()
    res = llm.generate(prompts, sp, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    outputs = [list(r.outputs[0].token_ids) for r in res]
    top = None
    if not spec.get("draft"):
        # The target's logprobs at each generated position, which tell a near-tie from an error where the run
        # with the draft parts (divergence()): prompt + output scored in one untimed prefill (asking for
        # logprobs while decoding costs the host enough to slow a small target's decoding: the H200, ~1.4x).
        score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=REFERENCE_TOP)
        scored = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p) + o) for p, o in zip(spec["prompts"], outputs)],
            score,
            use_tqdm=False,
        )
        top = [_scored_top(len(p), r.prompt_logprobs) for p, r in zip(spec["prompts"], scored)]
    metrics: dict[str, Any] = {}
    for mt in llm.get_metrics():
        if mt.name.startswith("vllm:spec_decode"):
            if hasattr(mt, "values"):
                metrics[mt.name] = list(mt.values)
            elif hasattr(mt, "value"):
                metrics[mt.name] = metrics.get(mt.name, 0) + mt.value
    out.write_text(
        json.dumps(
            {
                "outputs": outputs,
                "top": top,
                "texts": [r.outputs[0].text for r in res],
                "metrics": metrics,
                "elapsed_s": elapsed,
            }
        )
    )


def _scored_top(prompt_len: int, prompt_logprobs) -> list[list[list]]:
    """The generated positions' `prompt_logprobs` ({token id: Logprob} per position of prompt + output; the
    first None) as [[token, logprob], ...], best first: the target's top REFERENCE_TOP and the token there."""
    return [
        [[int(t), float(lp.logprob)] for t, lp in sorted((d or {}).items(), key=lambda kv: -kv[1].logprob)]
        for d in list(prompt_logprobs or [])[prompt_len:]
    ]


if __name__ == "__main__":
    _engine_main(Path(sys.argv[1]), Path(sys.argv[2]))
