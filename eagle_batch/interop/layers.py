"""Layer ids across conventions, converted in one place.

eagle-batch and vLLM number a hidden state by the decoder layers before it: id k is the input of decoder
layer k (id 0 the embeddings, id N the last layer's output before the final norm; docs/reference/store-format.md). SGLang,
and so SpecForge, number it by the layer that produced it: its id is k - 1 (id -1 is the embeddings).
speculators uses vLLM's ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eagle_batch.errors import UserError


class LayerError(UserError):
    """The store's layers cannot feed the peer's draft (no last layer, no aux layer, N unknown)."""


def to_output_convention(layer_ids: Sequence[int]) -> list[int]:
    """eagle-batch / vLLM ids (a layer's input) -> SGLang / SpecForge ids (the producing layer's output)."""
    return [int(k) - 1 for k in layer_ids]


def from_output_convention(layer_ids: Sequence[int]) -> list[int]:
    """SGLang / SpecForge ids -> eagle-batch / vLLM ids."""
    return [int(k) + 1 for k in layer_ids]


@dataclass(frozen=True)
class PeerLayers:
    """Which stored layers a peer's draft reads: the aux layers (ascending) and the last layer N."""

    aux_ids: list[int]
    last_id: int

    @property
    def ids(self) -> list[int]:
        """The ids in the order the peer stores them: aux ascending, then N."""
        return [*self.aux_ids, self.last_id]


def peer_layers(stored: Sequence[int], num_hidden_layers: int, where: str) -> PeerLayers:
    """Aux = every stored id but N, ascending (vLLM feeds them to the draft's fc in layer order); N must be
    stored (the targets come from it). `where` names the data in errors."""
    n = int(num_hidden_layers)
    stored = [int(k) for k in stored]
    if n <= 0:
        raise LayerError(
            f"{where}: the number of decoder layers N is unknown (the store predates the num_hidden_layers "
            "attribute); pass --num-hidden-layers N or --target MODEL_DIR (its config.json says N)."
        )
    if n not in stored:
        raise LayerError(
            f"{where} holds layers {stored} but not the last layer N={n} (the peer's training targets come "
            "from it); re-extract with it in model.layer_ids, or check --num-hidden-layers."
        )
    aux = sorted(k for k in stored if k != n)
    if not aux:
        raise LayerError(f"{where} holds only the last layer {n}; an EAGLE-3 draft needs aux layers too.")
    return PeerLayers(aux, n)
