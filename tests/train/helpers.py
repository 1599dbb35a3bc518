"""Test data for training: offline chat conversations and hidden states from transformers.

The chat data is real English written by people: questions about Python standard-library functions,
answered with the function's docstring (no dataset download needed, deterministic).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence

import numpy as np
import torch

MODULES = (
    "json",
    "os",
    "os.path",
    "re",
    "shutil",
    "collections",
    "itertools",
    "functools",
    "random",
    "math",
    "string",
    "textwrap",
    "datetime",
    "pathlib",
    "subprocess",
    "tempfile",
    "csv",
    "heapq",
    "bisect",
    "statistics",
    "fractions",
    "decimal",
    "copy",
    "pickle",
    "gzip",
    "zipfile",
    "tarfile",
    "logging",
    "argparse",
    "urllib.parse",
    "base64",
    "hashlib",
    "hmac",
    "uuid",
    "time",
    "calendar",
    "difflib",
    "fnmatch",
    "glob",
    "inspect",
    "operator",
    "contextlib",
    "threading",
    "queue",
    "socket",
    "email.utils",
    "html",
    "xml.etree.ElementTree",
    "sqlite3",
    "unittest",
    "typing",
    "dataclasses",
)

QUESTIONS = (
    "What does the Python function {name} do?",
    "Explain {name} in Python.",
    "How do I use {name}?",
    "Can you describe {name} from the standard library?",
)


def chat_conversations(limit: int = 300, min_chars: int = 120, max_chars: int = 1200) -> list[list[dict]]:
    out = []
    k = 0
    for mod_name in MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:
            continue
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if not callable(obj):
                continue
            doc = inspect.getdoc(obj) or ""
            if len(doc) < min_chars:
                continue
            q = QUESTIONS[k % len(QUESTIONS)].format(name=f"{mod_name}.{attr}")
            k += 1
            out.append([{"role": "user", "content": q}, {"role": "assistant", "content": doc[:max_chars]}])
            if len(out) >= limit:
                return out
    return out


def tokenize(tokenizer, conv: list[dict]) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) with the mask on the assistant reply (prefix-difference of the template)."""
    prompt = tokenizer.apply_chat_template(conv[:1], add_generation_prompt=True, tokenize=True)
    full = tokenizer.apply_chat_template(conv, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    full = list(full["input_ids"] if hasattr(full, "keys") else full)
    assert full[: len(prompt)] == prompt
    return full, [0] * len(prompt) + [1] * (len(full) - len(prompt))


def hf_samples(model_path, n: int, layer_ids: Sequence[int], max_length: int = 256) -> list[dict]:
    """Samples with the open_dataset keys, states from transformers (the capture 'hf' reference)."""
    from transformers import AutoTokenizer

    from eagle_batch.capture.hf import hf_hidden_states, load_hf_model

    tok = AutoTokenizer.from_pretrained(str(model_path))
    model = load_hf_model(str(model_path), dtype="float32", device="cpu")  # bf16 matmuls are slow on CPU
    out = []
    for i, conv in enumerate(chat_conversations(n)):
        ids, mask = tokenize(tok, conv)
        ids, mask = ids[:max_length], mask[:max_length]
        with torch.no_grad():
            hs = hf_hidden_states(model, ids, layer_ids).to(torch.bfloat16).cpu()
        out.append(
            {
                "input_ids": torch.tensor(ids),
                "loss_mask": torch.tensor(mask, dtype=torch.uint8),
                "hidden_states": hs,
                "sample_id": f"s{i}",
            }
        )
    return out


def random_samples(
    n: int, layer_ids: Sequence[int], hidden: int, vocab: int, seed: int = 0, min_len: int = 8, max_len: int = 64
) -> list[dict]:
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = int(g.integers(min_len, max_len + 1))
        ids = torch.from_numpy(g.integers(0, vocab, t)).long()
        mask = torch.from_numpy((np.arange(t) >= t // 3).astype(np.uint8))
        hs = g.standard_normal((t, len(layer_ids), hidden)).astype(np.float32)
        # Learnable: the last-layer state (which fixes the target's next-token distribution) at t+1 is
        # the highest aux state at t, so the draft's step 0 can fit the target through fc.
        hs[1:, -1] = 3.0 * hs[:-1, -2]
        hs = torch.from_numpy(hs).to(torch.bfloat16)
        out.append({"input_ids": ids, "loss_mask": mask, "hidden_states": hs, "sample_id": f"r{i}"})
    return out
