"""Dataset rows -> normalized chat messages (OpenAI style), or a BadRow naming what is wrong.

Formats: OpenAI `messages` (system/developer, user, assistant, tool; assistant `tool_calls`, the older
`function_call`, and `reasoning_content`), ShareGPT `conversations` (`from`/`value`), prompt/response
pairs, and Alpaca rows (`instruction`, `input`, `output`); column names come from `DataConfig`.
`format: auto` decides per row from which column is present. A turn's `data.turn_train_field` (Axolotl's
per-message `weight`: 0 or 1) marks assistant turns to leave out of the loss; they stay in the context.

Normalized messages hold only keys templates know: role, content (a string), and where present
reasoning_content, tool_calls, tool_call_id, name. Keys with None values are dropped, because Parquet
and Arrow give every struct field to every message and templates test `'tool_calls' in message`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Every reason a row can be skipped; the summary and bad_rows.jsonl use these names.
BAD_ROW_REASONS = {
    "invalid_json": "the line is not valid JSON",
    "invalid_csv": "the CSV/TSV record is malformed (an unclosed quote, more or fewer cells than the header)",
    "undecodable_bytes": "the bytes are not valid UTF-8",
    "invalid_text": "a string holds a lone UTF-16 surrogate (a JSON \\ud800-\\udfff escape without its pair), "
    "which is not text and cannot be tokenized",
    "row_too_long": "the record is longer than data.max_row_bytes; it was skipped unread",
    "file_too_large": "the file decompresses to more than data.max_decompressed_bytes; the rest of it was not read",
    "message_too_long": "a message is longer than data.max_message_chars characters",
    "truncated_file": "the file ends in the middle of a record (it was cut off); the complete records before it are kept",
    "not_an_object": "the row is not a JSON object / struct",
    "unknown_format": "no messages / conversations / prompt+response / instruction+output column in the row",
    "not_a_list": "the messages / conversations value is not a list of turns",
    "empty_messages": "the messages / conversations list is empty (no turns)",
    "missing_role": "a turn has no role (`role` or `from`)",
    "unknown_role": "a turn's role is not system, user, assistant or tool (or a known alias)",
    "non_string_content": "a turn's content is not a string (or a list of text parts)",
    "non_text_content": "a turn's content has non-text parts (images, audio)",
    "empty_content": "a user, tool or assistant turn has empty content",
    "bad_tool_calls": "an assistant's tool_calls are not a list of {function: {name, arguments}}",
    "no_assistant_turn": "the conversation has no assistant turn to train on",
    "no_trained_turn": "every assistant turn is marked not to be trained on (weight 0 in data.turn_train_field)",
    "bad_turn_weight": "a turn's data.turn_train_field value is not 0/1 or false/true",
    "no_user_turn": "the conversation has no user turn for the target to answer (regenerate)",
    "template_error": "the chat template failed or rendered the conversation inconsistently",
    "not_prefix_stable": "the template rewrites earlier turns (data.non_prefix_stable=error)",
    "empty_assistant_turn": "an assistant turn renders to nothing but end-of-turn markers, e.g. a tool call the "
    "chat template does not write (data.empty_assistant_turns=skip)",
}

# Reasons a sample (not a row) is dropped after tokenization; not input errors.
DROP_REASONS = {
    "too_few_loss_tokens": "fewer than data.min_loss_tokens loss tokens (assistant tokens the draft learns; after truncation)",
    "duplicate": "the same token ids and mask as an earlier sample (data.dedupe=true)",
}

_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}
# ShareGPT variants seen in the wild (Vicuna, glaive function calling, ...). A `function_call` turn is
# the assistant writing the call as text; `observation` is the tool's answer.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
    "function_call": "assistant",
}


@dataclass(frozen=True)
class Conversation:
    """A row as chat messages: what the template renders, and which assistant turns not to train on."""

    messages: list[dict]
    tools: list | None = None
    untrained: frozenset[int] = frozenset()  # indices into messages (weight 0)
    format: str = ""  # the format the row was read as
    also: tuple[str, ...] = ()  # other formats whose fields the row holds too (data.format=auto chose `format`)


class BadRow(ValueError):
    def __init__(self, reason: str, detail: str):
        assert reason in BAD_ROW_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def formats_in(row: dict, data_cfg, answers_needed: bool = True) -> list[str]:
    """The formats whose (non-null) fields the row holds, in the order `format: auto` prefers them. Without
    `answers_needed` (prompts for regeneration) a prompt or an instruction alone is a row too."""
    fields = {
        "messages": (data_cfg.messages_field,),
        "sharegpt": (data_cfg.conversations_field,),
        "prompt_response": (data_cfg.prompt_field, data_cfg.response_field)[: 2 if answers_needed else 1],
        "alpaca": ("instruction", "output")[: 2 if answers_needed else 1],
    }
    return [fmt for fmt, names in fields.items() if all(row.get(n) is not None for n in names)]


def detect_formats(row: dict, data_cfg, answers_needed: bool = True) -> list[str]:
    """`formats_in`, first the one `format: auto` reads the row as; a BadRow naming the field when none."""
    found = formats_in(row, data_cfg, answers_needed)
    if found:
        return found
    for name in (data_cfg.messages_field, data_cfg.conversations_field):
        if name in row:  # there but null: Parquet and Arrow give every row every column
            raise BadRow("not_a_list", f"'{name}' is null, expected a non-empty list of turns")
    if data_cfg.prompt_field in row and data_cfg.response_field in row:
        null = data_cfg.prompt_field if row[data_cfg.prompt_field] is None else data_cfg.response_field
        raise BadRow("empty_content", f"'{null}' is null")
    if answers_needed and row.get(data_cfg.prompt_field) is not None:
        raise BadRow(
            "unknown_format",
            f"the row has a '{data_cfg.prompt_field}' but no '{data_cfg.response_field}' "
            "(data.response_field): prepare trains on answers; `eagle-batch regenerate` has the target write "
            "them for prompts alone",
        )
    raise BadRow(
        "unknown_format",
        f"row has keys {sorted(row)[:12]}; expected '{data_cfg.messages_field}', "
        f"'{data_cfg.conversations_field}', '{data_cfg.prompt_field}'+'{data_cfg.response_field}' or "
        "'instruction'+'output' (Alpaca) (set data.*_field to your column names)",
    )


def _alpaca_row(row: dict, data_cfg) -> dict:
    """An Alpaca row (instruction, optional input, output) as a prompt/response row: the input follows the
    instruction after a blank line, as in Alpaca's own prompt."""
    parts = []
    for name in ("instruction", "input"):
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRow("non_string_content", f"'{name}' is {type(value).__name__}, expected a string")
        if value and value.strip():
            parts.append(value)
    return {
        data_cfg.system_field: row.get(data_cfg.system_field),
        data_cfg.prompt_field: "\n\n".join(parts),
        data_cfg.response_field: row.get("output"),
    }


def _check_text(messages: list[dict], tools) -> None:
    """BadRow for a lone UTF-16 surrogate (a JSON "\\ud83d" escape without its pair, common in scraped chats):
    Python keeps it in the string, but it is no text and the tokenizer raises on it."""
    try:
        json.dumps([messages, tools], ensure_ascii=False, default=str).encode("utf-8")
        return
    except UnicodeEncodeError as e:
        bad = e.object[e.start : e.end]
    where = next(
        (f"message {i} ({m['role']})" for i, m in enumerate(messages) if bad in json.dumps(m, ensure_ascii=False)),
        "'tools'",
    )
    raise BadRow("invalid_text", f"{where} holds the lone surrogate {bad!r}; remove it or repair the text")


def _content_text(value: Any, turn: int, role: str, allow_none: bool) -> str:
    if isinstance(value, str):
        return value
    if value is None and allow_none:
        return ""
    if isinstance(value, list):  # OpenAI content parts: [{"type": "text", "text": ...}, ...]
        texts = []
        for part in value:
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRow("non_text_content", f"turn {turn} ({role}) has a content part of type {kind!r}")
        return "".join(texts)
    raise BadRow("non_string_content", f"turn {turn} ({role}) content is {type(value).__name__}, not a string")


def _tool_calls(value: Any, turn: int) -> list[dict] | None:
    if value is None:
        return None
    if isinstance(value, str):  # some exports store the list as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadRow("bad_tool_calls", f"turn {turn} tool_calls is a string that is not JSON") from None
    if not isinstance(value, list):
        raise BadRow("bad_tool_calls", f"turn {turn} tool_calls is {type(value).__name__}, not a list")
    calls = []
    for c in value:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRow("bad_tool_calls", f"turn {turn}: each tool call needs function.name")
        args = fn.get("arguments")
        if not isinstance(args, (str, dict)):
            raise BadRow(
                "bad_tool_calls",
                f"turn {turn}: function.arguments of {fn['name']!r} must be a JSON "
                f"string or an object, not {type(args).__name__}",
            )
        call = {k: v for k, v in c.items() if v is not None}
        call["type"] = c.get("type") or "function"
        call["function"] = {"name": fn["name"], "arguments": args}
        calls.append(call)
    return calls or None


def _legacy_call(m: dict) -> list | None:
    """OpenAI's older `function_call` ({name, arguments}, one per turn) as a tool_calls list: without this the
    turn reads as an assistant turn with no content."""
    call = m.get("function_call")
    if call is None or m.get("tool_calls") is not None:
        return None
    return [{"type": "function", "function": call}]


def _turns(value: Any, field: str) -> list:
    if isinstance(value, str):  # exports that keep the conversation as a JSON string column
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadRow("not_a_list", f"'{field}' is a string that is not JSON") from None
    if value is None:
        raise BadRow("not_a_list", f"the row has no '{field}' (or it is null), expected a non-empty list of turns")
    if not isinstance(value, list):
        raise BadRow("not_a_list", f"'{field}' is {type(value).__name__}, expected a non-empty list of turns")
    if not value:  # the right shape with nothing in it: not a format problem, so not not_a_list
        raise BadRow("empty_messages", f"'{field}' is an empty list; a conversation needs turns")
    return value


def normalize_message(m: Any, turn: int, sharegpt: bool) -> dict | None:
    """One turn -> normalized message; None for an empty system turn (dropped: it says nothing)."""
    if not isinstance(m, dict):
        raise BadRow("not_an_object", f"turn {turn} is {type(m).__name__}, not an object")
    if sharegpt and "from" not in m and "role" in m:
        sharegpt = False  # a messages list in the conversations column, or vice versa
    if not sharegpt and "role" not in m and "from" in m:
        sharegpt = True
    raw_role = m.get("from") if sharegpt else m.get("role")
    if raw_role is None or raw_role == "":
        raise BadRow("missing_role", f"turn {turn} has no '{'from' if sharegpt else 'role'}'")
    table = _SHAREGPT_ROLES if sharegpt else _OPENAI_ROLES
    role = table.get(str(raw_role).lower()) if isinstance(raw_role, str) else None
    if role is None:
        raise BadRow("unknown_role", f"turn {turn} has role {raw_role!r}; known: {sorted(table)}")
    msg: dict[str, Any] = {"role": role}
    if role == "assistant" and not sharegpt:
        calls = _tool_calls(_legacy_call(m) or m.get("tool_calls"), turn)
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None and not isinstance(reasoning, str):
            raise BadRow("non_string_content", f"turn {turn} reasoning_content is {type(reasoning).__name__}")
        content = _content_text(m.get("content"), turn, role, allow_none=bool(calls or reasoning))
        if not content.strip() and not calls and not (reasoning and reasoning.strip()):
            raise BadRow("empty_content", f"turn {turn} (assistant) has no content, reasoning or tool calls")
        msg["content"] = content
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = calls
        return msg
    content = _content_text(m.get("value") if sharegpt else m.get("content"), turn, role, allow_none=False)
    if not content.strip():
        if role == "system":
            return None
        raise BadRow("empty_content", f"turn {turn} ({role}) has empty content")
    msg["content"] = content
    if role == "tool" and not sharegpt:
        for k in ("tool_call_id", "name"):
            if isinstance(m.get(k), str):
                msg[k] = m[k]
    return msg


def row_to_conversation(row: Any, data_cfg, require_assistant: bool = True) -> Conversation:
    """A dataset row -> Conversation. Raises BadRow (also for a conversation without an assistant turn to
    train on unless `require_assistant=False`: prompts for regeneration need none)."""
    if not isinstance(row, dict):
        raise BadRow("not_an_object", f"row is {type(row).__name__}, not an object")
    fmt, also = data_cfg.format, ()
    if fmt == "auto":
        fmt, *rest = detect_formats(row, data_cfg, answers_needed=require_assistant)
        also = tuple(rest)
    read_as = fmt
    if fmt == "alpaca":
        row, fmt = _alpaca_row(row, data_cfg), "prompt_response"
    untrained: set[int] = set()
    if fmt == "prompt_response":
        messages = []
        system = row.get(data_cfg.system_field)
        if system is not None:
            if not isinstance(system, str):
                raise BadRow("non_string_content", f"'{data_cfg.system_field}' is {type(system).__name__}")
            if system.strip():
                messages.append({"role": "system", "content": system})
        for field, role in ((data_cfg.prompt_field, "user"), (data_cfg.response_field, "assistant")):
            value = row.get(field)
            if value is None and role == "assistant" and not require_assistant:
                break  # a prompt to regenerate an answer for
            if not isinstance(value, str):
                raise BadRow(
                    "non_string_content" if value is not None else "unknown_format",
                    f"'{field}' is {type(value).__name__}, expected a string",
                )
            if not value.strip():
                raise BadRow("empty_content", f"'{field}' is empty")
            messages.append({"role": role, "content": value})
    elif fmt in ("messages", "sharegpt"):
        field = data_cfg.messages_field if fmt == "messages" else data_cfg.conversations_field
        turns = _turns(row.get(field), field)
        messages = []
        for i, t in enumerate(turns):
            m = normalize_message(t, i, sharegpt=fmt == "sharegpt")
            if m is None:
                continue
            # Regeneration replaces the answers, so their marks do not apply there.
            if require_assistant and m["role"] == "assistant" and not _trained(t, i, data_cfg.turn_train_field):
                untrained.add(len(messages))
            messages.append(m)
    else:
        raise ValueError(f"data.format={fmt!r}; use auto, messages, sharegpt, prompt_response or alpaca")
    if require_assistant and not any(m["role"] == "assistant" for m in messages):
        raise BadRow("no_assistant_turn", "the conversation has no assistant turn")
    if require_assistant and not any(m["role"] == "assistant" and i not in untrained for i, m in enumerate(messages)):
        raise BadRow(
            "no_trained_turn",
            f"every assistant turn has {data_cfg.turn_train_field}=0; set data.turn_train_field='' to train on "
            "them anyway",
        )
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            tools = None
    if not isinstance(tools, list) or not tools:
        tools = None
    _check_text(messages, tools)
    _check_lengths(messages, int(data_cfg.max_message_chars))
    return Conversation(messages, tools, frozenset(untrained), read_as, also)


def _check_lengths(messages: list[dict], limit: int) -> None:
    """BadRow `message_too_long` when a message's content, reasoning or tool-call arguments pass `limit`
    characters (0 = no cap): what the chat template and the tokenizer would otherwise spend minutes on."""
    if not limit:
        return
    for i, m in enumerate(messages):
        texts = [m.get("content"), m.get("reasoning_content")]
        texts += [
            str(c.get("function", {}).get("arguments", "")) for c in m.get("tool_calls") or () if isinstance(c, dict)
        ]
        longest = max((len(t) for t in texts if isinstance(t, str)), default=0)
        if longest > limit:
            raise BadRow(
                "message_too_long",
                f"message {i} ({m['role']}) has {longest} characters, over data.max_message_chars={limit} (raise "
                "it if such messages are genuine)",
            )


def _trained(turn: dict, index: int, key: str) -> bool:
    """Whether an assistant turn is trained on: its `key` value (Axolotl's `weight`, `train`, `training`)
    is 1/true or absent. Any other value is refused rather than guessed: a column of sampling weights
    (0.5) under that name would otherwise silently decide which turns train."""
    if not key or turn.get(key) is None:
        return True
    value = turn[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise BadRow(
        "bad_turn_weight",
        f"turn {index} has {key}={value!r}; expected 0 or 1 (false/true) to leave the turn out of the loss or "
        f"train on it; if '{key}' means something else in this dataset, set data.turn_train_field='' "
        "(or to the field that marks trained turns)",
    )
