"""Compare captured hidden states with the transformers reference, per layer.

Metrics per layer (over all tokens of the compared samples):
- `cos_mean` / `cos_min`: cosine similarity of each token's captured vs reference vector;
- `max_rel`: max |captured - reference| / max |reference| (max-abs error relative to the layer's scale,
  robust to the "massive activation" outlier channels real models have).
A layer passes when cos_mean >= extract.validate_min_cosine and max_rel <= extract.validate_max_rel_err.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class LayerReport:
    layer_id: int
    cos_mean: float
    cos_min: float
    max_rel: float
    passed: bool = True


@dataclass
class ValidationReport:
    samples: list[str] = field(default_factory=list)
    tokens: int = 0
    layers: list[LayerReport] = field(default_factory=list)
    min_cosine: float = 0.999
    max_rel_err: float = 0.05

    @property
    def passed(self) -> bool:
        return bool(self.layers) and all(l.passed for l in self.layers)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d

    def table(self) -> str:
        rows = [f"{'layer':>6} {'cos_mean':>10} {'cos_min':>10} {'max_rel':>10}  result"]
        for l in self.layers:
            rows.append(
                f"{l.layer_id:>6} {l.cos_mean:>10.6f} {l.cos_min:>10.6f} {l.max_rel:>10.2e}  "
                f"{'ok' if l.passed else 'FAIL'}"
            )
        rows.append(
            f"{len(self.samples)} samples, {self.tokens} tokens: {'PASS' if self.passed else 'FAIL'} "
            f"(cos_mean >= {self.min_cosine}, max_rel <= {self.max_rel_err})"
        )
        return "\n".join(rows)


class LayerAccumulator:
    """Streams (captured, reference) pairs [T, L, H] and reduces them per layer."""

    def __init__(self, layer_ids: Sequence[int]):
        self.layer_ids = list(layer_ids)
        L = len(self.layer_ids)
        self.cos_sum = torch.zeros(L, dtype=torch.float64)
        self.cos_min = torch.full((L,), float("inf"), dtype=torch.float64)
        self.err_max = torch.zeros(L, dtype=torch.float64)
        self.ref_max = torch.zeros(L, dtype=torch.float64)
        self.tokens = 0
        self.samples: list[str] = []

    def add(self, sample_id: str, got: torch.Tensor, ref: torch.Tensor) -> None:
        if got.shape != ref.shape:
            raise ValueError(f"sample {sample_id}: captured shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
        g, r = got.double().cpu(), ref.double().cpu()
        cos = torch.nn.functional.cosine_similarity(g, r, dim=-1)  # [T, L]
        self.cos_sum += cos.sum(0)
        self.cos_min = torch.minimum(self.cos_min, cos.min(0).values)
        self.err_max = torch.maximum(self.err_max, (g - r).abs().amax(dim=(0, 2)))
        self.ref_max = torch.maximum(self.ref_max, r.abs().amax(dim=(0, 2)))
        self.tokens += int(g.shape[0])
        self.samples.append(sample_id)

    def report(self, min_cosine: float, max_rel_err: float) -> ValidationReport:
        rep = ValidationReport(
            samples=list(self.samples), tokens=self.tokens, min_cosine=min_cosine, max_rel_err=max_rel_err
        )
        for j, lid in enumerate(self.layer_ids):
            cm = float(self.cos_sum[j] / max(self.tokens, 1))
            mr = float(self.err_max[j] / max(float(self.ref_max[j]), 1e-30))
            rep.layers.append(
                LayerReport(lid, cm, float(self.cos_min[j]), mr, passed=cm >= min_cosine and mr <= max_rel_err)
            )
        return rep
