"""Which of a model repository's own Python code runs, and saying so when it does.

`trust_remote_code` lets transformers or vLLM import Python files shipped inside a model folder: code from
whoever published (or last changed) that folder, run as you. eagle-batch keeps two flags so each use is
chosen on its own: `model.tokenizer_trust_remote_code` (the tokenizer, built on the login node by prepare,
regenerate's plan and evaluate; Kimi's tiktoken tokenizer is such code) and `model.engine_trust_remote_code`
(the model itself, in vLLM or transformers on the GPU nodes; vLLM ships its own classes for the supported
models, so it is rarely needed). `model.trust_remote_code`, the single flag of earlier releases, still sets
both, with a warning. Whenever one is on, the command says which folder's code runs, once.
"""

from __future__ import annotations

import sys
from pathlib import Path


def tokenizer_remote_code(model_cfg) -> bool:
    return bool(model_cfg.tokenizer_trust_remote_code or model_cfg.trust_remote_code)


def engine_remote_code(model_cfg) -> bool:
    return bool(model_cfg.engine_trust_remote_code or model_cfg.trust_remote_code)


def announce(key: str, folder: str, what: str) -> None:
    """One line on stderr: `key` is on, so the Python files of `folder` run as this user for `what`."""
    files = sorted(p.name for p in Path(folder).glob("*.py")) if Path(folder).is_dir() else []
    shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "") if files else "none now"
    print(
        f"eagle-batch: {key}=true: the Python code in {folder} ({shown}) runs as you to build {what}; "
        "trust that folder as you trust your own code.",
        file=sys.stderr,
    )


def deprecated_flag_note(model_cfg) -> None:
    if model_cfg.trust_remote_code:
        print(
            "eagle-batch: model.trust_remote_code is deprecated: it turns on both "
            "model.tokenizer_trust_remote_code and model.engine_trust_remote_code; set only the one your model "
            "needs (docs/explanation/security.md).",
            file=sys.stderr,
        )
