"""The per-stage quantities the stage model computes and the evaluator reads: compute
seconds (per micro-batch, as prefix sums over the chain), static memory and activations."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCompute:
    """Seconds per micro-batch on one rank, summed over some layers."""

    fwd_s: float
    """Forward."""
    bwd_s: float
    """Backward."""
    full_recompute_s: float
    """What full recompute of those layers' blocks adds (their forward)."""
    selective_recompute_s: float
    """What selective recompute adds (the framework's kind: `Runtime.selective`)."""
    attention_fwd_s: float = 0.0
    """The fused attention's forward (what one context-parallel ring step hides behind)."""


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Prefix sums over the chain of per-micro-batch seconds on one rank: entry i is the sum
    over layers 0..i-1 (so a range [first, stop) is `x[stop] - x[first]`)."""

    fwd_s: tuple[float, ...]
    """Forward."""
    bwd_s: tuple[float, ...]
    """Backward."""
    full_recompute_s: tuple[float, ...]
    """Full recompute (blocks only)."""
    selective_recompute_s: tuple[float, ...]
    """Selective recompute (blocks only)."""
    attention_fwd_s: tuple[float, ...]
    """Attention forward (blocks only)."""

    def span(self, first: int, stop: int) -> StageCompute:
        """The sums over chain layers [first, stop)."""
        return StageCompute(
            fwd_s=self.fwd_s[stop] - self.fwd_s[first],
            bwd_s=self.bwd_s[stop] - self.bwd_s[first],
            full_recompute_s=self.full_recompute_s[stop] - self.full_recompute_s[first],
            selective_recompute_s=(
                self.selective_recompute_s[stop] - self.selective_recompute_s[first]
            ),
            attention_fwd_s=self.attention_fwd_s[stop] - self.attention_fwd_s[first],
        )

    def layer(self, i: int) -> StageCompute:
        """Layer i alone."""
        return self.span(i, i + 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticMemory:
    """Bytes a stage holds whatever the micro-batch: model states and buffers."""

    params_bytes: float
    """Working parameters."""
    grads_bytes: float
    """Gradients."""
    optimizer_bytes: float
    """Optimizer states and master weights."""
    other_bytes: float
    """Runtime context and communication buffers."""

    @property
    def total_bytes(self) -> float:
        """Sum of every part."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.other_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class StageActivations:
    """Activation bytes of one stage per sequence, in the training dtype."""

    kept_bytes: float
    """Kept for backward by one micro-batch (times the in-flight count at the peak)."""
    transient_bytes: float
    """The largest transient on top (a layer's peak, or a fully recomputed block's forward)."""
    step_transient_bytes: float = 0.0
    """A transient on top that does not grow with the micro-batch, per micro-batch (the
    embedding's weight-sized backward: `memory.step_tmp_bytes`)."""
    head_kept_bytes: float = 0.0
    """Of `kept_bytes`, the head's (0 on a stage without it), which a schedule may hold for
    fewer micro-batches than the rest of the stage (`memory.head_in_flight`)."""

    def peak_bytes(self, inflight: float, mbs: int, head_inflight: float | None = None) -> float:
        """Activation bytes at the stage's peak with `inflight` micro-batches of `mbs` (the
        head's for `head_inflight` of them where given)."""
        head = self.head_kept_bytes * (inflight if head_inflight is None else head_inflight)
        kept = (self.kept_bytes - self.head_kept_bytes) * inflight + head
        return kept * mbs + max(self.transient_bytes * mbs, self.step_transient_bytes)
