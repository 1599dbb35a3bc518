"""Prepare stage: chat datasets -> token ids, exact assistant-only loss masks and a shard plan.

Public API (see docs/explanation/architecture.md):
- `tokenize_conversation(tokenizer, messages, max_length=None, **template_kwargs) -> (input_ids, loss_mask)`
- `PreparedDataset(run_dir)`: `.num_tasks`, `.task_samples(task_id) -> list[Sample]`
- `prepare(cfg, workers=1)`: what `eagle-batch prepare` runs.

Heavy imports (transformers, pyarrow) happen inside functions, so importing this package is cheap.
"""

from .dataset import PreparedDataset, Sample
from .formats import BAD_ROW_REASONS, DROP_REASONS, BadRow, row_to_conversation
from .plan import plan_lpt
from .template import (
    TemplateError,
    TemplateNotPrefixStable,
    render_samples,
    template_info,
    tokenize_conversation,
    tokenize_conversation_samples,
)


def prepare(cfg, workers: int = 1, progress: bool = True, force: bool = False, tokenizer=None) -> dict:
    """What `eagle-batch prepare` runs (data/preparation.py). The module's name differs from this function's:
    importing a submodule named `prepare` would replace this function on the package."""
    from .preparation import prepare as _prepare

    return _prepare(cfg, workers=workers, progress=progress, force=force, tokenizer=tokenizer)


__all__ = [
    "BAD_ROW_REASONS",
    "DROP_REASONS",
    "BadRow",
    "PreparedDataset",
    "Sample",
    "TemplateError",
    "TemplateNotPrefixStable",
    "plan_lpt",
    "prepare",
    "render_samples",
    "row_to_conversation",
    "template_info",
    "tokenize_conversation",
    "tokenize_conversation_samples",
]
