"""Fixtures for the prepare stage: tokenizers of several chat-template families, built locally."""

from __future__ import annotations

import itertools

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def masked_runs(tokenizer, ids, mask) -> list[str]:
    """Decoded text of each maximal run of masked tokens, in order."""
    runs = []
    for flag, group in itertools.groupby(zip(ids, mask), key=lambda x: x[1]):
        if flag:
            runs.append(
                tokenizer.decode(
                    [int(i) for i, _ in group], skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            )
    return runs


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


TEMPLATES = __import__("pathlib").Path(__file__).parent / "templates"

# Special tokens of each family as the real tokenizers mark them (special=True tokens are what the
# end-of-turn probe looks for; DeepSeek's role and tool markers and Qwen's <think> are plain added tokens).
FAMILY_TOKENS = {
    "llama3": dict(
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        special=[
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        plain=[],
    ),
    "deepseek_v3": dict(
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        special=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        plain=[
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
        ],
    ),
    "kimi_k2": dict(
        bos="[BOS]",
        eos="<|im_end|>",
        special=[
            "[BOS]",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ],
        plain=[],
    ),
    "qwen3": dict(
        bos=None,
        eos="<|im_end|>",
        special=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        plain=["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
    ),
}


def build_family_tokenizer(smollm2_path, family: str):
    """The SmolLM2 BPE vocabulary plus a family's special tokens and its public chat template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    spec = FAMILY_TOKENS[family]
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in spec["special"]], special_tokens=True)
    if spec["plain"]:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["plain"]])
    tok.eos_token = spec["eos"]
    tok.bos_token = spec["bos"]
    tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    return tok


@pytest.fixture(scope="session")
def family_tokenizers(smollm2_path, smollm2_tokenizer):
    toks = {f: build_family_tokenizer(smollm2_path, f) for f in FAMILY_TOKENS}
    toks["chatml"] = smollm2_tokenizer
    return toks
