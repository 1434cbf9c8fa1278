"""The public Python API (thin: the planner does the work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .planner.api import PlanOutcome
    from .planner.cluster import Cluster
    from .planner.model import ModelProfile
    from .planner.model_spec import TransformerSpec


def plan(
    model: str | TransformerSpec | ModelProfile,
    cluster: str | Cluster,
    *,
    global_batch: int,
    seq_len: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    memory_headroom: float = 0.1,
    fix: str | dict[str, object] | None = None,
    top_k: int = 3,
    gpus_per_node: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> PlanOutcome:
    """Plan `model` (a preset/spec string, a `TransformerSpec` or a `ModelProfile`) on
    `cluster` (e.g. ``"8xh100"`` or a `Cluster`). Raises ValueError on bad input and
    `NoFeasiblePlanError` (a ValueError) when nothing fits."""
    from .planner.api import make_plan
    from .planner.cluster import Cluster, parse_cluster
    from .planner.config import TrainConfig
    from .planner.model import ModelProfile
    from .planner.model_spec import TransformerSpec, parse_model
    from .planner.search import parse_fix

    spec = parse_model(model) if isinstance(model, str) else model
    if isinstance(spec, TransformerSpec):
        seq = spec.seq if seq_len is None else seq_len
        profile = spec.to_profile(seq, act_bytes=2 if precision != "fp32" else 4)
    elif isinstance(spec, ModelProfile):
        profile, seq = spec, spec.seq_len if seq_len is None else seq_len
    else:
        raise ValueError(
            f"model={model!r}: expected a preset or spec string, a TransformerSpec or a "
            "ModelProfile"
        )
    if isinstance(cluster, Cluster):
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node applies to a cluster string; the Cluster has its own")
        cl = cluster
    else:
        cl = parse_cluster(cluster, gpus_per_node=gpus_per_node)
    train = TrainConfig(
        global_batch=global_batch, seq_len=seq, precision=precision,  # type: ignore[arg-type]
        optimizer=optimizer, memory_headroom=memory_headroom,  # type: ignore[arg-type]
    )  # fmt: skip
    fixed = parse_fix(fix) if isinstance(fix, str) else dict(fix or {})
    return make_plan(profile, cl, train, fixed=fixed, top_k=top_k, progress=progress)
