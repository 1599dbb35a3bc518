"""One dataset row -> training samples: decode, normalize, render with the chat template, tokenize.

`process_chunk(records)` is what prepare's worker processes run (or the main process with one worker): it
turns each RawRecord into a RowResult (its samples, or why it was skipped) with the tokenizer and data
config `init_worker` installed in the process. The tokenizer of a run is `load_tokenizer(cfg)`; regenerate
renders its prompts with the same one, so prepare later sees the conversations as they were generated.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle_batch import environment
from eagle_batch.config import ConfigError, RunConfig
from eagle_batch.config.remote_code import announce, tokenizer_remote_code
from eagle_batch.config.validate import check_tokenizer_files, tokenizer_key

from .formats import BadRow, row_to_conversation
from .readers import RawRecord, decode_record
from .template import (
    EmptyAssistantTurn,
    TemplateError,
    TemplateNotPrefixStable,
    render_samples,
    template_info,
    tokenize_rendered,
)


def load_tokenizer(cfg: RunConfig):
    """The run's tokenizer (model.tokenizer or model.path) with model.chat_template applied if set."""
    return load_tokenizer_from(
        cfg.model.tokenizer or cfg.model.path,
        cfg.model.chat_template,
        tokenizer_remote_code(cfg.model),
        key=tokenizer_key(cfg),
        announce_remote_code=True,
    )


def load_tokenizer_from(
    src: str,
    chat_template: str = "",
    trust_remote_code: bool = False,
    key: str = "model.path / model.tokenizer",
    announce_remote_code: bool = False,
):
    """`key` is the config key that named `src`, for the errors: every failure here is the input's (a wrong
    folder, a partial download, a damaged file), so each is a ConfigError naming the key and the folder."""
    environment.set_offline_defaults()
    from transformers import AutoTokenizer

    if not src or not Path(src).is_dir():
        raise ConfigError(
            f"{key} = {src!r} is not a local folder; point it at a "
            "Hugging Face model or tokenizer folder (nothing is downloaded)."
        )
    check_tokenizer_files(src, key)  # the check extract makes too (check_model_files)
    if trust_remote_code and announce_remote_code:
        announce("model.tokenizer_trust_remote_code", src, "the tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    except Exception as e:  # a damaged tokenizer.json, a config naming a class that is not there, ...
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"{key}={src}: the tokenizer does not load ({type(e).__name__}: {detail}); its tokenizer files "
            "may be damaged or incomplete: download them again, or set model.tokenizer to a folder with a "
            "working tokenizer."
        ) from None
    if chat_template:
        p = Path(chat_template)
        if not p.is_file():
            raise ConfigError(f"model.chat_template={p}: no such file; give a Jinja template file or leave it empty.")
        tok.chat_template = p.read_text()
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"the tokenizer in {src} has no chat template; set model.chat_template to a Jinja file.")
    return tok


def sample_id(ids: np.ndarray, mask: np.ndarray) -> str:
    """Content hash of the tokenized sample: the same conversation always gets the same id."""
    h = hashlib.blake2b(ids.astype(np.int32, copy=False).tobytes(), digest_size=10)
    h.update(mask.astype(np.uint8, copy=False).tobytes())
    return h.hexdigest()


@dataclass
class RowResult:
    file: str
    index: int
    line_kind: str
    bad: tuple[str, str] | None = None
    samples: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)  # (id, ids, mask)
    dropped: list[str] = field(default_factory=list)  # per-sample drop reasons
    truncated: int = 0
    loss_tokens_cut: int = 0  # assistant (loss-carrying) tokens beyond data.max_length, cut off with the tail
    split: bool = False  # the template was not prefix-stable: more than one sample for this row
    unrendered: tuple[str, ...] = ()  # message fields the template left out (e.g. reasoning in ChatML)
    empty_turns_masked: int = 0  # assistant turns left out of the loss for rendering empty
    turns_untrained: int = 0  # assistant turns left out of the loss by data.turn_train_field (weight 0)
    format: str = ""  # the format the row was read as
    also: tuple[str, ...] = ()  # other formats whose fields the row also holds (data.format=auto)
    keys: tuple[str, ...] = ()  # the row's fields, when it was skipped for its shape (what the file holds)


# Worker state (set once per process by _init_worker; the main process uses it too when workers=1).
_W: dict[str, Any] = {}


def init_worker(model: dict, data: dict, tokenizer=None) -> None:
    _W["tok"] = (
        tokenizer
        if tokenizer is not None
        else load_tokenizer_from(
            model["tokenizer"] or model["path"],
            model["chat_template"],
            bool(model["tokenizer_trust_remote_code"] or model["trust_remote_code"]),
        )
    )
    _W["data"] = DataView(data)


class DataView:
    """Attribute access to the data section (picklable, no omegaconf in the hot loop)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)


def process_chunk(records: list[RawRecord]) -> list[RowResult]:
    tok, data = _W["tok"], _W["data"]
    kwargs = dict(data.chat_template_kwargs or {})
    results: list[RowResult] = []
    rendered_all = []  # (result index, RenderedSample)
    for rec in records:
        res = RowResult(rec.file, rec.index, rec.line_kind)
        results.append(res)
        row = None
        try:
            row = decode_record(rec)
            conv = row_to_conversation(row, data)
            messages, res.format, res.also = conv.messages, conv.format, conv.also
            kw = dict(kwargs, tools=conv.tools) if conv.tools else kwargs
            rendered = render_samples(
                tok,
                messages,
                non_prefix_stable=data.non_prefix_stable,
                empty_turns=data.empty_assistant_turns,
                untrained=conv.untrained,
                **kw,
            )
        except BadRow as e:
            res.bad = (e.reason, e.detail)
            if isinstance(row, dict):
                res.keys = tuple(sorted(str(k) for k in row)[:40])
            continue
        except TemplateNotPrefixStable as e:
            res.bad = ("not_prefix_stable", str(e))
            continue
        except EmptyAssistantTurn as e:
            res.bad = ("empty_assistant_turn", str(e))
            continue
        except TemplateError as e:
            res.bad = ("template_error", str(e))
            continue
        except ValueError as e:  # render_samples: no trainable assistant turn (e.g. only at position 0)
            res.bad = ("no_assistant_turn", str(e))
            continue
        res.split = len(rendered) > 1
        res.unrendered = _unrendered_fields(messages, rendered)
        trained = {t for r in rendered for t in r.turns} | conv.untrained
        res.empty_turns_masked = sum(
            1 for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0 and i not in trained
        )
        res.turns_untrained = len(conv.untrained)
        rendered_all.extend((len(results) - 1, r) for r in rendered)
    if rendered_all:
        info = template_info(tok, **kwargs)
        encoded = tokenize_rendered(tok, [r for _, r in rendered_all], info)
        for (ri, _), (ids, mask) in zip(rendered_all, encoded):
            res = results[ri]
            if data.max_length and len(ids) > data.max_length:
                res.loss_tokens_cut += int(mask[data.max_length :].sum())
                ids, mask = ids[: data.max_length], mask[: data.max_length]
                res.truncated += 1
            if int(mask.sum()) < max(1, data.min_loss_tokens):
                res.dropped.append("too_few_loss_tokens")
                continue
            res.samples.append((sample_id(ids, mask), ids, mask))
    return results


def _unrendered_fields(messages: list[dict], rendered) -> tuple[str, ...]:
    """Fields present in the data that the chat template does not write (so they are not trained on).

    Not an error: many templates ignore reasoning or tool calls, but the summary should say so.
    """
    text = "".join(r.text for r in rendered)
    missing = set()
    for m in messages:
        if m["role"] != "assistant":
            continue
        reasoning = m.get("reasoning_content")
        if reasoning and reasoning.strip() not in text:
            missing.add("reasoning_content")
        for call in m.get("tool_calls") or ():
            if call["function"]["name"] not in text:
                missing.add("tool_calls")
    return tuple(sorted(missing))
