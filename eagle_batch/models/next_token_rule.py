"""A random target whose greedy next token is a known function of the current token.

A random-weight target's next token is a hash of its whole context: no draft can learn it, so a draft served
beside it accepts nothing, and its greedy outputs are full of near-ties (top two logits closer than bf16
rounding), so two runs of the same target part from each other. That checks the plumbing of a served draft
but not that a draft trained at the target's width learns and is accepted. This rule gives the random target
one learnable, wide-margin behaviour and leaves every decoder layer as random as before:

- `K` output tokens: the K most frequent tokens of a chat corpus (what the draft's vocabulary, the most
  frequent loss tokens, will hold), and K orthonormal directions u_0..u_{K-1} of the hidden space;
- each vocabulary token t gets a class c(t) in [0, K) (seeded draw) and the embedding
  E[t] = std * (alpha * sqrt(H) * u_c(t) + r_t), r_t ~ N(0, 1)^H;
- lm_head row of the k-th output token = u_k, every other row 0.

The final hidden state of token t is E[t] plus what the layers add; the logit of output k is its projection
on u_k (after the final norm), so the greedy next token is output c(t), ahead of the others by a margin that
grows with `std` against what the layers add. The layers stay random and count: the input of each is
normalised, so each adds a fixed amount whatever E's scale (at H = 7168 the dense first layer adds ~5 per
channel, 0.9 x E's norm at std 4; on the CPU, 2 layers at H = 7168, std 4: the rule's token wins at every
position of three demo chats by >= 37 logits, std 1: by >= 9). Generation from any token walks the K output
tokens; a draft learns c() from the embedding it is given.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class NextTokenRule:
    outputs: list[int]  # the K output token ids, most frequent first
    seed: int = 0
    alpha: float = 1.0  # weight of the class direction in each embedding row, against the random part
    std: float = 4.0  # scale of the embedding rows: against what the layers add (below)

    def classes(self, vocab: int, device) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(self.seed + 7)
        return torch.randint(0, len(self.outputs), (vocab,), generator=gen).to(device)

    def directions(self, hidden: int, device) -> torch.Tensor:
        """[K, H]: orthonormal rows."""
        gen = torch.Generator(device="cpu").manual_seed(self.seed + 11)
        q, _ = torch.linalg.qr(torch.randn(hidden, len(self.outputs), generator=gen, dtype=torch.float64))
        return q.T.contiguous().to(device=device, dtype=torch.float32)

    def embedding(self, vocab: int, hidden: int, dtype, device, gen: torch.Generator) -> torch.Tensor:
        u = self.directions(hidden, device)
        e = torch.empty(vocab, hidden, dtype=torch.float32, device=device).normal_(0.0, 1.0, generator=gen)
        e.add_(u[self.classes(vocab, device)], alpha=self.alpha * hidden**0.5)
        return e.mul_(self.std).to(dtype)

    def lm_head(self, vocab: int, hidden: int, dtype, device) -> torch.Tensor:
        w = torch.zeros(vocab, hidden, dtype=torch.float32, device=device)
        w[torch.tensor(self.outputs, device=device)] = self.directions(hidden, device)
        return w.to(dtype)

    def greedy_next(self, token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
        """The output token the rule gives each of `token_ids` (of a vocabulary of `vocab`)."""
        return torch.tensor(self.outputs)[self.classes(vocab, "cpu")[token_ids.cpu().long()]]

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "seed": self.seed, "alpha": self.alpha, "std": self.std}


def most_frequent_tokens(chats: str | Path, tokenizer, k: int) -> list[int]:
    """The `k` most frequent token ids (ties: lower id) over the message contents of a messages-JSONL file."""
    counts: Counter[int] = Counter()
    with open(chats, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                for m in json.loads(line).get("messages", []):
                    counts.update(tokenizer(str(m.get("content", "")), add_special_tokens=False)["input_ids"])
    if len(counts) < k:
        raise ValueError(f"{chats}: {len(counts)} distinct tokens, fewer than the {k} outputs the rule needs")
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
