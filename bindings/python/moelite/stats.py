"""Expert-store statistics (moelite_expert_stats) as a Python value, read from a Model (every
context) or from one Context.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Union

from . import _lib


@dataclasses.dataclass(frozen=True)
class ExpertStats:
    """moelite_expert_stats: cumulative expert-store counters of one layer or of all layers.

    All zero except routed_tokens/routed_experts when every expert is resident (no budget).
    Identities the library keeps: hits + misses == activations; routed_experts ==
    routed_tokens x top-k with exact gating; read_busy_seconds is store-wide (0 in a layer's
    record)."""
    activations: int        # experts asked for by routing (one per expert and batch)
    hits: int               # ... that were resident or already loading
    misses: int             # ... that had to be loaded on demand
    prefetches_issued: int
    prefetches_used: int
    prefetches_wasted: int  # speculative loads evicted or dropped before use
    bytes_read: int         # from storage
    wait_seconds: float     # time computation waited for loads
    predicted: int          # activations whose expert a predictor named beforehand
    predictions: int        # distinct experts predicted
    ready_when_needed: int  # activations whose expert was fully loaded when asked for
    routed_tokens: int      # (token, layer) pairs routed, budget or not
    routed_experts: int     # experts they used after adaptive gating
    read_busy_seconds: float  # wall time with a storage read in flight (all layers only)
    reads: int              # read requests that landed (3 per expert from the model, 1 packed)

    @classmethod
    def _from_c(cls, s: "_lib.ExpertStats") -> "ExpertStats":
        return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls)})

    def as_dict(self) -> Dict[str, Union[int, float]]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class QualityStats:
    """moelite_quality_stats: what lossy gating cost a context, measured by the quality meter on
    sampled tokens against exact routing, and predicted by the sensitivity model on every token;
    the governor's threshold and target. All zero with exact gating."""
    gated_tokens: int
    predicted_loss: float          # per token
    metered_tokens: int
    kl_mean: float                 # KL(exact || gated), nats per token
    kl_stderr: float
    top1_agreement: float
    top1_stderr: float
    predicted_loss_metered: float  # per token, of the metered tokens
    meter_evaluations: int
    meter_seconds: float
    threshold: float               # the gating threshold in use now
    target_kl: float               # the governor's target (0: none)
    kl_per_predicted: float        # the governor's estimate of KL per unit of predicted loss

    @classmethod
    def _from_c(cls, s: "_lib.QualityStats") -> "QualityStats":
        return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls)})

    def as_dict(self) -> Dict[str, Union[int, float]]:
        return dataclasses.asdict(self)
