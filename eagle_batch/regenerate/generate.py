"""One regeneration task: vLLM writes the assistant turns of the task's conversations, batch by batch.

For a batch of scripts (plan.py), turn by turn: every conversation waiting for an answer is rendered with
the model's own chat template (the tokenizer prepare uses, `regenerate.chat_template_kwargs`), all prompts
go to the engine in one `generate` call, each answer is appended, and the next round renders the history
including it. Every conversation ends with one outcome:

- `complete`: every turn of its script was written;
- `shortened`: a turn could not be written (reason below) after at least one complete answer: the
  conversation is written up to its last complete answer;
- `failed`: the first turn could not be written: nothing is written for it.

Reasons a turn cannot be written: `too_long` (the prompt does not fit `model.max_model_len`: vLLM needs the
prompt plus one generated token), `cut_off` (the answer reached `regenerate.max_tokens`, finish reason
"length": it lacks its end; with `regenerate.keep_cut_off` it is written and ends the conversation),
`empty_output` (an answer that is empty after stripping whitespace).

The batch is then committed as one shard (shards.py); a task resumed after a kill or a requeue skips
every committed conversation. Sampling uses one seed per conversation and turn (regenerate.seed and the
conversation id), so an answer does not depend on which batch or attempt generated it.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from eagle_batch.capture import vllm_compat as compat
from eagle_batch.capture.backend import start_engine_defaults
from eagle_batch.config import RunConfig, model_info
from eagle_batch.config.remote_code import engine_remote_code
from eagle_batch.data.template import prompt_ids
from eagle_batch.launch.work import TaskContext

from .plan import task_scripts, template_kwargs
from .shards import ShardWriter

REASONS = ("too_long", "cut_off", "empty_output")
# Per shard record: conversations by outcome and reason, answers written, and answers that hit max_tokens.
COUNTS = (
    "complete",
    *(f"shortened_{r}" for r in REASONS),
    *(f"failed_{r}" for r in REASONS),
    "turns_written",
    "answers_cut_off",
    "tokens_generated",
    "prompt_tokens",
)


@dataclass
class Conversation:
    """A script being played out: `out` is the conversation so far; `pos` indexes the script."""

    script: dict
    out: list[dict] = field(default_factory=list)
    pos: int = 0
    turns: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=lambda: [0, 0])  # [prompt, generated] tokens over its turns
    outcome: str = "active"  # active | complete | shortened | failed
    reason: str = ""  # why it ended early (REASONS)

    def advance(self) -> bool:
        """Copy the given messages up to the next turn to write; True when an answer is needed."""
        msgs = self.script["messages"]
        while self.outcome == "active" and self.pos < len(msgs) and msgs[self.pos] is not None:
            self.out.append(msgs[self.pos])
            self.pos += 1
        if self.outcome == "active" and self.pos >= len(msgs):
            self.outcome = "complete"
        return self.outcome == "active"

    def end_early(self, reason: str) -> None:
        """No answer for this turn: keep the conversation up to its last complete answer, if it has one."""
        self.reason = reason
        if self.turns == 0:
            self.outcome = "failed"
            return
        while self.out and self.out[-1]["role"] != "assistant":  # nothing after the last answer answers it
            self.out.pop()
        self.outcome = "shortened"

    def take(self, text: str, finish_reason: str | None, keep_cut_off: bool) -> None:
        self.finish_reasons.append(str(finish_reason))
        if finish_reason == "length":
            if not keep_cut_off:
                self.end_early("cut_off")
                return
            self._answer(text)
            if self.pos < len(self.script["messages"]):  # later turns would continue from a cut answer
                self.outcome, self.reason = "shortened", "cut_off"
        elif not text.strip():
            self.end_early("empty_output")
        else:
            self._answer(text)

    def _answer(self, text: str) -> None:
        self.out.append({"role": "assistant", "content": text})
        self.turns += 1
        self.pos += 1

    def count_key(self) -> str:
        return self.outcome if self.outcome == "complete" else f"{self.outcome}_{self.reason}"


class Generator:
    """The task's engine and tokenizer; `run(batch)` -> (rows, failures, counts) for one shard."""

    def __init__(self, cfg: RunConfig):
        from vllm import LLM

        from eagle_batch.data.rows import load_tokenizer

        m, rg = cfg.model, cfg.regenerate
        self.cfg, self.rg = cfg, rg
        self.kwargs = template_kwargs(cfg)
        self.tok = load_tokenizer(cfg)  # the template prepare renders with (model.chat_template included)
        kw: dict[str, Any] = dict(
            model=m.path,
            tokenizer=m.tokenizer or m.path,
            dtype=m.dtype,
            tensor_parallel_size=m.tensor_parallel_size,
            max_model_len=m.max_model_len,
            gpu_memory_utilization=rg.gpu_memory_utilization,
            enforce_eager=cfg.extract.enforce_eager,
            trust_remote_code=engine_remote_code(m),
            seed=rg.seed,
        )
        if m.revision:
            kw["revision"] = m.revision
        kw.update(compat.cpu_mla_engine_args(model_info(m.path).uses_mla, m.dtype))
        kw.update(dict(cfg.extract.extra_engine_args or {}))
        start_engine_defaults("regenerate")
        self.llm = LLM(**kw)

    def _sampling(self, conv_id: str, turn: int):
        from vllm import SamplingParams

        seed = int(hashlib.blake2b(f"{conv_id}/{turn}".encode(), digest_size=4).hexdigest(), 16) ^ self.rg.seed
        rg = self.rg
        return SamplingParams(
            temperature=rg.temperature, top_p=rg.top_p, top_k=rg.top_k, max_tokens=rg.max_tokens, seed=seed
        )

    def render(self, conv: Conversation) -> list[int]:
        """The prompt for the conversation's next answer: its history through the chat template."""
        tools = conv.script.get("tools")
        kw = dict(self.kwargs, tools=tools) if tools else self.kwargs
        return prompt_ids(self.tok, conv.out, **kw)

    def run(self, batch: list[dict]) -> tuple[list[dict], list[dict], dict[str, int]]:
        convs = [Conversation(s) for s in batch]
        limit = self.cfg.model.max_model_len - 1
        while waiting := [c for c in convs if c.advance()]:
            asked, prompts, params = [], [], []
            for c in waiting:
                ids = self.render(c)
                if len(ids) > limit:
                    c.end_early("too_long")
                    continue
                asked.append(c)
                prompts.append(compat.tokens_prompt(ids))
                params.append(self._sampling(c.script["id"], c.turns))
            if asked:
                for c, res in zip(asked, self.llm.generate(prompts, params, use_tqdm=False)):
                    out = res.outputs[0]
                    c.tokens[0] += len(res.prompt_token_ids or ())
                    c.tokens[1] += len(out.token_ids)
                    c.take(out.text, out.finish_reason, self.rg.keep_cut_off)
        return self._results(convs)

    def _provenance(self, c: Conversation) -> dict:
        m, rg = self.cfg.model, self.rg
        return {
            "id": c.script["id"],
            "source_file": c.script["source_file"],
            "source_row": c.script["source_row"],
            "model": m.name or m.path,
            "revision": m.revision,
            "turns_written": c.turns,
            "finish_reasons": c.finish_reasons,
            "outcome": c.outcome,
            "ended_by": c.reason,
            "sampling": {
                "temperature": rg.temperature,
                "top_p": rg.top_p,
                "top_k": rg.top_k,
                "max_tokens": rg.max_tokens,
                "seed": rg.seed,
            },
            "chat_template_kwargs": self.kwargs,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _results(self, convs: list[Conversation]) -> tuple[list[dict], list[dict], dict[str, int]]:
        counts = dict.fromkeys(COUNTS, 0)
        rows, failures = [], []
        for c in convs:
            counts[c.count_key()] += 1
            counts["turns_written"] += c.turns
            counts["answers_cut_off"] += c.finish_reasons.count("length")
            counts["prompt_tokens"] += c.tokens[0]
            counts["tokens_generated"] += c.tokens[1]
            if c.outcome == "failed":
                s = c.script
                failures.append(
                    {"id": s["id"], "reason": c.reason, "source_file": s["source_file"], "source_row": s["source_row"]}
                )
                continue
            row: dict[str, Any] = {"messages": c.out}
            if c.script.get("tools"):
                row["tools"] = c.script["tools"]
            row["provenance"] = self._provenance(c)
            rows.append(row)
        return rows, failures, counts

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):  # best effort: the task process ends right after
                llm.llm_engine.engine_core.shutdown()


def regenerate_work(ctx: TaskContext) -> bool:
    """The work of one regeneration array task (the contract of eagle_batch/launch/work.py)."""
    cfg = ctx.cfg
    scripts = task_scripts(ctx.run_dir, ctx.task_id)
    weight = {s["id"]: int(s["weight"]) for s in scripts}
    ctx.set_totals(len(scripts), sum(weight.values()))
    with ShardWriter(ctx.run_dir, ctx.task_id, fsync=cfg.store.fsync) as w:

        def report() -> None:
            ctx.report(len(w.committed), sum(weight.get(i, 0) for i in w.committed))

        report()
        todo = [s for s in scripts if s["id"] not in w.committed]
        if not todo:
            return True
        gen = Generator(cfg)
        try:
            for i in range(0, len(todo), cfg.regenerate.batch_conversations):
                if ctx.should_stop():
                    return False
                batch = todo[i : i + cfg.regenerate.batch_conversations]
                t0 = time.monotonic()
                rows, failures, counts = gen.run(batch)
                counts["generate_ms"] = int(1000 * (time.monotonic() - t0))
                w.commit([s["id"] for s in batch], rows, failures, counts)
                report()
        finally:
            gen.close()
    return True
