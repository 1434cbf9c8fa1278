"""The hidden costs of PowerSGD, offload and the asynchronous pipeline, as a plan records them
(`planner/options.py` computes them; `paraplan explain` prints them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class HiddenCosts:
    """What the options cost that the step time and memory totals do not show by name (per
    GPU of the bounding stage; the defaults: no option taken)."""

    powersgd_rank: int = 0
    """PowerSGD rank (0: uncompressed)."""
    uncompressed_step_time_s: float = 0.0
    """Step time of the same plan without PowerSGD (0 without it): the predicted saving is
    this less the plan's step time."""
    compression_compute_s: float = 0.0
    """Seconds per step of compression compute (thin GEMMs, orthogonalization)."""
    compression_wire_ratio: float = 1.0
    """Bytes all-reduced compressed / uncompressed (1 without PowerSGD)."""
    error_feedback_bytes: float = 0.0
    """PowerSGD's error-feedback buffer and warm-start P, Q on the GPU."""
    offload_pcie_bytes: float = 0.0
    """Bytes over the host link per step (parameter and activation offload)."""
    offload_exposed_s: float = 0.0
    """Step seconds of those copies not hidden under compute."""
    offload_host_bytes: float = 0.0
    """Host memory per GPU the offloaded model states take (parameter offload)."""
    offload_saved_bytes: float = 0.0
    """GPU memory the offload frees at the peak stage."""
    stashed_weight_bytes: float = 0.0
    """The asynchronous pipeline's second weight version."""
    staleness_steps: int = 0
    """Weight staleness of the asynchronous pipeline (0: synchronous)."""
