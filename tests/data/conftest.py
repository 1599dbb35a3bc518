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
            runs.append(tokenizer.decode([int(i) for i, _ in group], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False))
    return runs


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
