"""Chat template -> token ids and an exact assistant-only loss mask, using the model's own template.

How the mask is found (no per-model string formats anywhere):

1. For every assistant turn k we render, with the tokenizer's `apply_chat_template`,
   `prompt_k` = messages[:k] with `add_generation_prompt=True` (what the model is given) and
   `through_k` = messages[:k+1] (the conversation as the template writes it once turn k is done).
   The text the model generates in turn k is `through_k[len(prompt_k):]`, minus the template's
   inter-turn "tail" (text the template writes after the end-of-turn token, e.g. ChatML's "\\n" after
   `<|im_end|>`, which the model never generates because it stops at the end-of-turn token).
2. The tail is learned once per tokenizer from a probe conversation: the text after the assistant's
   content up to and including the first special token is the end-of-turn marker; the rest is tail.
3. A template is prefix-stable for a conversation when every `through_k` is a prefix of the full
   rendering; then one sample masks every assistant turn. Templates that rewrite history (Qwen3 drops
   earlier turns' `<think>` reasoning, and renders the last turn differently) are not: with
   `non_prefix_stable="per_turn"` we emit the fewest samples that cover every turn, each rendered the
   way the model saw it when it generated that turn (one per assistant turn in the worst case).
4. Text is tokenized segment by segment (unmasked / masked pieces), so every masked token lies wholly
   inside the generated text and the prompt tokens are exactly what the model was prompted with.
   Tokenizers that cannot be split that way (SentencePiece with a dummy-prefix space) fall back to one
   joint encoding and assign tokens to the mask by their character offsets.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

_SENTINEL = "EaGlEbAtChSeNtInEl"


class TemplateError(ValueError):
    """The chat template failed or behaved inconsistently on a conversation."""


class TemplateNotPrefixStable(TemplateError):
    """Rendering a later turn rewrites earlier ones, so one sequence cannot hold every turn as generated."""


class EmptyAssistantTurn(TemplateError):
    """An assistant turn renders to nothing but end-of-turn markers (with empty_turns="skip")."""


@dataclass(frozen=True)
class TemplateInfo:
    # Text the template writes after the end-of-turn token that the model does not generate.
    eot_tail: str
    # Whether encoding pieces separately and concatenating reproduces the text (no dummy prefix).
    segment_safe: bool


_info_cache: dict[tuple, tuple[Any, TemplateInfo]] = {}
_info_lock = threading.Lock()


def _special_strings(tokenizer) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        if getattr(tok, "special", False):
            specials.add(str(tok))
    return [s for s in specials if s]


def _render(tokenizer, conversations: list[list[dict]], add_generation_prompt: bool, template_kwargs) -> list[str]:
    try:
        out = tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
    except Exception as e:  # jinja raise_exception(), TypeError from str + None, ...
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    return list(out)


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def template_info(tokenizer, **template_kwargs) -> TemplateInfo:
    """Probe the template once per (tokenizer, template, kwargs) for its end-of-turn tail."""
    key = (
        id(tokenizer),
        getattr(tokenizer, "chat_template", None)
        if isinstance(getattr(tokenizer, "chat_template", None), str)
        else repr(getattr(tokenizer, "chat_template", None)),
        repr(sorted((k, repr(v)) for k, v in template_kwargs.items() if k != "tools")),
    )
    with _info_lock:
        hit = _info_cache.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    tail = ""
    try:
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
        probe_kwargs = {k: v for k, v in template_kwargs.items() if k != "tools"}
        text = _render(tokenizer, [probe], False, probe_kwargs)[0]
        after = text[text.rindex(_SENTINEL) + len(_SENTINEL) :]
        ends = [after.find(s) + len(s) for s in _special_strings(tokenizer) if s in after]
        # No special token after the content: the template has no end-of-turn marker, so we mask the
        # content only (tail = everything the template adds after it).
        tail = after[min(ends) :] if ends else after
    except (TemplateError, ValueError):
        tail = ""  # the template cannot render the probe; mask through the end of each turn
    probes = ["Hello", " world", "\n\nfoo bar", "x", " 12.5%", "é中"]
    enc = _encode_pieces(tokenizer, probes)
    # Each piece must round-trip alone AND concatenated (a SentencePiece dummy prefix survives the first
    # check, since decode strips one leading space, but not the second).
    segment_safe = all(_decode(tokenizer, ids) == s for ids, s in zip(enc, probes)) and _decode(
        tokenizer, [t for ids in enc for t in ids]
    ) == "".join(probes)
    info = TemplateInfo(eot_tail=tail, segment_safe=segment_safe)
    with _info_lock:
        _info_cache[key] = (tokenizer, info)
    return info


def _encode_pieces(tokenizer, pieces: Sequence[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return [e.ids for e in backend.encode_batch(list(pieces), add_special_tokens=False)]
    return list(tokenizer(list(pieces), add_special_tokens=False)["input_ids"])


@dataclass
class RenderedSample:
    """One training sequence as text: the full rendering and the char spans of generated text."""

    text: str
    spans: list[tuple[int, int]]  # sorted, non-overlapping [start, end) char ranges to mask
    turns: list[int]  # indices (into messages) of the assistant turns this sample trains on


def render_samples(
    tokenizer,
    messages: list[dict],
    non_prefix_stable: str = "error",
    empty_turns: str = "keep",
    untrained: Collection[int] = (),
    **template_kwargs,
) -> list[RenderedSample]:
    """Render a conversation into the fewest samples that train on every assistant turn not in `untrained`
    (indices into messages; those turns stay in the context of later ones).

    An assistant turn whose generated text is nothing but special tokens (typically a tool call that the
    chat template does not write, leaving only the end-of-turn marker) would teach the draft to end turns
    at once: `empty_turns="mask"` leaves such turns out of the loss (they stay in the context),
    `"skip"` raises EmptyAssistantTurn, `"keep"` trains on them like any other turn.

    Raises TemplateNotPrefixStable when more than one sample is needed and non_prefix_stable="error",
    TemplateError when the template fails or its generation prompt does not start the rendered turn,
    ValueError when there is no assistant turn to train on.
    """
    if non_prefix_stable not in ("error", "per_turn"):
        raise ValueError(f"non_prefix_stable={non_prefix_stable!r}; use 'error' or 'per_turn'")
    if empty_turns not in ("keep", "mask", "skip"):
        raise ValueError(f"empty_turns={empty_turns!r}; use 'keep', 'mask' or 'skip'")
    # A turn at position 0 has no prompt to generate from (nothing to render with a generation
    # prompt); it stays in the context of later samples but is not trained on.
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0 and i not in untrained]
    if not turns:
        raise ValueError("no assistant turn to train on")
    messages = list(messages[: turns[-1] + 1])  # trailing user/tool turns carry no loss
    info = template_info(tokenizer, **template_kwargs)
    prompts = _render(tokenizer, [messages[:i] for i in turns], True, template_kwargs)
    throughs = _render(tokenizer, [messages[: i + 1] for i in turns], False, template_kwargs)
    spans: list[tuple[int, int]] = []
    for i, p, t in zip(turns, prompts, throughs):
        if not t.startswith(p):
            raise TemplateError(
                f"the generation prompt for assistant turn {i} is not a prefix of that turn as rendered "
                f"(prompt ends {p[-40:]!r}, turn starts {t[max(0, len(p) - 40) : len(p)]!r}); the template "
                "renders this message sequence inconsistently"
            )
        end = len(t)
        tail = info.eot_tail
        if tail and t.endswith(tail) and end - len(tail) > len(p):
            end -= len(tail)
        spans.append((len(p), end))
    if empty_turns != "keep":
        empty = _empty_turns(tokenizer, throughs, spans)
        if empty and empty_turns == "skip":
            raise EmptyAssistantTurn(
                f"assistant turn {turns[empty[0]]} renders to nothing but end-of-turn "
                f"markers ({throughs[empty[0]][spans[empty[0]][0] : spans[empty[0]][1]]!r}: "
                "a tool call the chat template does not write?)"
            )
        if empty:
            keep = [j for j in range(len(turns)) if j not in empty]
            if not keep:
                raise ValueError("no assistant turn to train on (every assistant turn renders empty)")
            turns, prompts, throughs, spans = ([x[j] for j in keep] for x in (turns, prompts, throughs, spans))
    remaining = list(range(len(turns)))
    samples: list[RenderedSample] = []
    while remaining:
        k = remaining[-1]
        base = throughs[k]
        covered = [j for j in remaining if base.startswith(throughs[j])]
        samples.append(RenderedSample(text=base, spans=[spans[j] for j in covered], turns=[turns[j] for j in covered]))
        remaining = [j for j in remaining if j not in covered]
    if len(samples) > 1 and non_prefix_stable == "error":
        raise TemplateNotPrefixStable(
            f"the chat template rewrites earlier turns when later ones are added (e.g. drops their "
            f"reasoning): {len(turns)} assistant turns need {len(samples)} separate sequences; set "
            "data.non_prefix_stable=per_turn to emit them as separate samples"
        )
    samples.reverse()  # earliest turn first: deterministic and reads naturally
    return samples


def _empty_turns(tokenizer, throughs: list[str], spans: list[tuple[int, int]]) -> list[int]:
    """Indexes of the turns whose generated text is only special tokens and whitespace."""
    specials = sorted(_special_strings(tokenizer), key=len, reverse=True)
    out = []
    for j, (t, (a, b)) in enumerate(zip(throughs, spans)):
        text = t[a:b]
        for sp in specials:
            text = text.replace(sp, "")
        if not text.strip():
            out.append(j)
    return out


def tokenize_rendered(
    tokenizer, samples: Sequence[RenderedSample], info: TemplateInfo | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids (int32) and loss mask (uint8) for rendered samples, one encode call for all of them."""
    info = info or template_info(tokenizer)
    if not info.segment_safe:
        return [_tokenize_joint(tokenizer, s) for s in samples]
    pieces: list[str] = []
    flags: list[int] = []
    bounds: list[tuple[int, int]] = []
    for s in samples:
        start = len(pieces)
        pos = 0
        for a, b in s.spans:
            if a > pos:
                pieces.append(s.text[pos:a])
                flags.append(0)
            pieces.append(s.text[a:b])
            flags.append(1)
            pos = b
        if pos < len(s.text):
            pieces.append(s.text[pos:])
            flags.append(0)
        bounds.append((start, len(pieces)))
    enc = _encode_pieces(tokenizer, pieces)
    out = []
    for start, stop in bounds:
        ids = np.array(list(chain.from_iterable(enc[start:stop])), dtype=np.int32)
        mask = np.repeat(np.asarray(flags[start:stop], dtype=np.uint8), [len(piece) for piece in enc[start:stop]])
        out.append((ids, mask))
    return out


def _tokenize_joint(tokenizer, s: RenderedSample) -> tuple[np.ndarray, np.ndarray]:
    enc = tokenizer(s.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    mask = np.zeros(len(ids), dtype=np.uint8)
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        # A token belongs to the generated text when it starts inside a generated span.
        if any(sa <= a < sb for sa, sb in s.spans) and b > a:
            mask[t] = 1
    return ids, mask


def tokenize_conversation_samples(
    tokenizer,
    messages: list[dict],
    max_length: int | None = None,
    non_prefix_stable: str = "per_turn",
    **template_kwargs,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Like `tokenize_conversation`, but returns several samples when the template is not prefix-stable."""
    rendered = render_samples(tokenizer, messages, non_prefix_stable=non_prefix_stable, **template_kwargs)
    out = tokenize_rendered(tokenizer, rendered, template_info(tokenizer, **template_kwargs))
    if max_length:
        out = [(ids[:max_length], mask[:max_length]) for ids, mask in out]
    return out


def tokenize_conversation(
    tokenizer, messages: list[dict], max_length: int | None = None, **template_kwargs
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of a conversation rendered with the tokenizer's own chat template.

    loss_mask is 1 exactly on the tokens the model generates in each assistant turn (content, reasoning
    and tool-call text as the template writes them, plus the end-of-turn token) and 0 on role headers,
    system, user and tool text. Truncation keeps the first `max_length` tokens of both. Raises
    TemplateNotPrefixStable for conversations that need several sequences (use
    `tokenize_conversation_samples`), TemplateError when the template fails.
    """
    ((ids, mask),) = tokenize_conversation_samples(
        tokenizer, messages, max_length=max_length, non_prefix_stable="error", **template_kwargs
    )
    return ids.tolist(), mask.tolist()


def prompt_ids(tokenizer, messages: list[dict], **template_kwargs: Any) -> list[int]:
    """The token ids of `messages` through the chat template, ending with the generation prompt: what the
    model is asked to continue. transformers 5 returns a BatchEncoding from apply_chat_template, 4.x a list."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **template_kwargs)
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return [int(i) for i in ids]
