"""Structural rules a strategy must satisfy before the cost model can price it.

One rule list judges both the candidates of the search and the user's `--fix` pins. A rule
reads an `Assignment`: a `Strategy` (every dimension set) or `Pins` (None: left to the search).
It fires only when no way of filling in the unset dimensions satisfies it, so a complete
strategy is judged exactly and a pin is rejected as soon as the pinned values alone break a
rule (the search still checks each completed strategy against every rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from math import prod
from typing import Protocol

from ..cluster import Cluster
from ..config import TrainConfig
from ..model import ModelProfile
from ..strategy import MeshAxis, Recompute, Schedule

_ALL_AXES = frozenset(MeshAxis)
_ZERO_STAGES = (0, 1, 2, 3)


class Rule(StrEnum):
    """The structural rules, in the order they are checked (the first broken one is named)."""

    WORLD_SIZE = "world_size"
    """dp*tp*pp*cp equals the GPUs of the cluster."""
    TP_DIVIDES_MODEL = "tp_divides_model"
    """TP divides the attention heads and the MLP width."""
    TP_FITS_KV_HEADS = "tp_fits_kv_heads"
    """TP divides the key/value heads or is a multiple of them (GQA heads are replicated)."""
    SP_NEEDS_TP = "sp_needs_tp"
    """Sequence parallelism splits along the TP group: it needs tp > 1."""
    CP_SPLITS_SEQUENCE = "cp_splits_sequence"
    """The sequence splits into 2*cp equal chunks (causal load balancing)."""
    EP_NEEDS_MOE = "ep_needs_moe"
    """Expert parallelism needs a mixture-of-experts model."""
    EP_DIVIDES = "ep_divides"
    """EP divides the experts and the data-parallel degree (EP lives inside the dp axis), or
    with the experts folded over TP (`expert_tp` 1) ep // tp does."""
    EXPERT_TP = "expert_tp"
    """The experts' TP degree is tp or 1; 1 (folded) with tp > 1 needs a MoE model, sequence
    parallelism, no context parallelism and an ep that is a multiple of tp."""
    ZERO_STAGE = "zero_stage"
    """ZeRO stage is 0, 1, 2 or 3."""
    HSDP_SHARDS_DP = "hsdp_shards_dp"
    """An HSDP shard group (`dp_shard`) divides dp, and sharding below dp needs ZeRO-3."""
    OFFLOAD_NEEDS_ZERO = "offload_needs_zero"
    """Optimizer offload needs ZeRO >= 1 (ZeRO-Offload partitions the states)."""
    BATCH_DIVIDES = "batch_divides"
    """dp * micro_batch_size divides the global batch."""
    SCHEDULE_MATCHES_PP = "schedule_matches_pp"
    """Schedule `none` exactly when there is no pipeline (pp = 1)."""
    VIRTUAL_STAGES_MATCH_SCHEDULE = "virtual_stages_match_schedule"
    """More than one virtual stage exactly with the interleaved 1F1B schedule."""
    STAGES_WITHIN_BLOCKS = "stages_within_blocks"
    """pp * virtual_stages chunks, each with at least one block."""
    INTERLEAVED_MICROBATCHES = "interleaved_microbatches"
    """Interleaved 1F1B runs micro-batches in groups of pp (Narayanan et al. 2021 §2.2)."""
    MESH_ORDER = "mesh_order"
    """The mesh order names each mesh axis once."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The strategy dimensions the rule reads."""
        return _FIELDS[self]


_FIELDS: dict[Rule, tuple[str, ...]] = {
    Rule.WORLD_SIZE: ("dp", "tp", "pp", "cp"),
    Rule.TP_DIVIDES_MODEL: ("tp",),
    Rule.TP_FITS_KV_HEADS: ("tp",),
    Rule.SP_NEEDS_TP: ("sequence_parallel", "tp"),
    Rule.CP_SPLITS_SEQUENCE: ("cp",),
    Rule.EP_NEEDS_MOE: ("ep",),
    Rule.EP_DIVIDES: ("ep", "dp", "tp", "expert_tp"),
    Rule.EXPERT_TP: ("expert_tp", "tp", "ep", "sequence_parallel", "cp"),
    Rule.ZERO_STAGE: ("zero_stage",),
    Rule.HSDP_SHARDS_DP: ("dp_shard", "dp", "zero_stage"),
    Rule.OFFLOAD_NEEDS_ZERO: ("offload_optimizer", "zero_stage"),
    Rule.BATCH_DIVIDES: ("dp", "micro_batch_size"),
    Rule.SCHEDULE_MATCHES_PP: ("schedule", "pp"),
    Rule.VIRTUAL_STAGES_MATCH_SCHEDULE: ("virtual_stages", "schedule"),
    Rule.STAGES_WITHIN_BLOCKS: ("pp", "virtual_stages"),
    Rule.INTERLEAVED_MICROBATCHES: ("schedule", "dp", "micro_batch_size", "pp"),
    Rule.MESH_ORDER: ("mesh_order",),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """A structural rule broken, and why."""

    rule: Rule
    """Which rule."""
    message: str
    """The values that break it, the rule and the fix."""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, kw_only=True, slots=True)
class ProblemShape:
    """What the rules need to know of the model, cluster and batch."""

    heads: int
    """Attention heads."""
    kv_heads: int
    """Key/value heads (GQA)."""
    ffn: int
    """MLP hidden width."""
    experts: int
    """MoE experts per block (0 for a dense model)."""
    is_moe: bool
    """Whether the blocks hold MoE experts."""
    num_blocks: int
    """Transformer blocks (pipeline chunks need at least one each)."""
    num_gpus: int
    """GPUs of the cluster."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""

    @classmethod
    def of(cls, profile: ModelProfile, cluster: Cluster, train: TrainConfig) -> ProblemShape:
        """The shape of one planning problem."""
        return cls(
            heads=profile.heads,
            kv_heads=profile.kv_heads,
            ffn=profile.ffn,
            experts=profile.experts,
            is_moe=profile.is_moe,
            num_blocks=profile.decoder_blocks,  # each chunk holds one at least
            num_gpus=cluster.num_gpus,
            seq_len=train.seq_len,
            global_batch=train.global_batch,
        )


class Assignment(Protocol):
    """Strategy dimensions, possibly partial (None: not yet chosen). `Strategy` sets them all;
    `Pins` sets those the user fixed."""

    @property
    def dp(self) -> int | None: ...
    @property
    def tp(self) -> int | None: ...
    @property
    def pp(self) -> int | None: ...
    @property
    def cp(self) -> int | None: ...
    @property
    def ep(self) -> int | None: ...
    @property
    def expert_tp(self) -> int | None: ...
    @property
    def folded_experts(self) -> bool | None: ...
    @property
    def zero_stage(self) -> int | None: ...
    @property
    def dp_shard(self) -> int | None: ...
    @property
    def sequence_parallel(self) -> bool | None: ...
    @property
    def virtual_stages(self) -> int | None: ...
    @property
    def micro_batch_size(self) -> int | None: ...
    @property
    def schedule(self) -> Schedule | None: ...
    @property
    def recompute(self) -> Recompute | None: ...
    @property
    def offload_optimizer(self) -> bool | None: ...
    @property
    def mesh_order(self) -> tuple[MeshAxis, ...] | None: ...


def _set(a: Assignment, keys: tuple[str, ...]) -> list[tuple[str, int]]:
    """The set integer dimensions among `keys`, with their values."""
    return [(k, v) for k in keys if (v := getattr(a, k)) is not None]


def _product_text(pairs: list[tuple[str, int]]) -> str:
    """``tp=3`` for one dimension, ``dp*tp = 2*3 = 6`` for several."""
    if len(pairs) == 1:
        return f"{pairs[0][0]}={pairs[0][1]}"
    names = "*".join(k for k, _ in pairs)
    values = "*".join(str(v) for _, v in pairs)
    return f"{names} = {values} = {prod(v for _, v in pairs)}"


def _world_size(sh: ProblemShape, a: Assignment) -> str | None:
    found = cluster_violation(sh.num_gpus, a)
    return None if found is None else found.message


def cluster_violation(num_gpus: int, a: Assignment) -> Violation | None:
    """The world-size rule alone: what pinned degrees can be refused from the cluster's GPU
    count before any model is read or traced."""
    pairs = _set(a, _FIELDS[Rule.WORLD_SIZE])
    if not pairs:
        return None
    n, total = num_gpus, prod(v for _, v in pairs)
    ok = total == n if len(pairs) == 4 else total >= 1 and n % total == 0
    if ok:
        return None
    if len(pairs) == 4:
        message = (
            f"{_product_text(pairs)} GPUs, but the cluster has {n}; use degrees whose product "
            f"is {n}"
        )
    elif len(pairs) == 1:
        message = f"{pairs[0][0]} must divide the {n} GPUs of the cluster; use a divisor of {n}"
    else:
        message = (
            f"{_product_text(pairs)} must divide the {n} GPUs of the cluster; use smaller degrees"
        )
    return Violation(rule=Rule.WORLD_SIZE, message=message)


def _tp_divides_model(sh: ProblemShape, a: Assignment) -> str | None:
    tp = a.tp
    if tp is None or (tp >= 1 and sh.heads % tp == 0 and sh.ffn % tp == 0):
        return None
    return f"tp={tp} must divide heads={sh.heads} and ffn={sh.ffn}; use a common divisor"


def _tp_fits_kv_heads(sh: ProblemShape, a: Assignment) -> str | None:
    tp, kv = a.tp, sh.kv_heads
    if tp is None or tp < 1 or kv % tp == 0 or tp % kv == 0:
        return None
    return f"tp={tp} must divide kv_heads={kv} or be a multiple of it"


def _sp_needs_tp(sh: ProblemShape, a: Assignment) -> str | None:
    if a.sequence_parallel and a.tp == 1:
        return "sequence_parallel needs tp > 1; use tp > 1 or sequence_parallel=false"
    return None


def _cp_splits_sequence(sh: ProblemShape, a: Assignment) -> str | None:
    cp = a.cp
    if cp is None or cp <= 1 or sh.seq_len % (2 * cp) == 0:
        return None
    return f"cp={cp} needs seq_len={sh.seq_len} divisible by 2*cp (causal load balance)"


def _ep_needs_moe(sh: ProblemShape, a: Assignment) -> str | None:
    if a.ep is None or a.ep <= 1 or sh.is_moe:
        return None
    return f"ep={a.ep} needs a MoE model (mixture of experts); this one is dense: use ep=1"


def _ep_divides(sh: ProblemShape, a: Assignment) -> str | None:
    ep, dp, tp = a.ep, a.dp, a.tp
    if ep is None or ep <= 1 or not sh.is_moe:
        return None
    folded = a.folded_experts
    if folded and tp is not None:
        if sh.experts % ep == 0 and ep % tp == 0 and (dp is None or dp % (ep // tp) == 0):
            return None
        with_dp = "" if dp is None else f" and ep/tp={ep}/{tp} must divide dp={dp}"
        return (
            f"ep={ep} with expert_tp=1 (experts folded over TP) must divide experts="
            f"{sh.experts}, be a multiple of tp={tp}{with_dp}"
        )
    if sh.experts % ep == 0 and (dp is None or dp % ep == 0 or folded is None):
        return None
    with_dp = "" if dp is None else f" and dp={dp}"
    fold = " (or fold the experts over TP: expert_tp=1)" if with_dp else ""
    return f"ep={ep} must divide experts={sh.experts}{with_dp}{fold}"


def _expert_tp(sh: ProblemShape, a: Assignment) -> str | None:
    etp, tp = a.expert_tp, a.tp
    if etp is None:
        return None
    if etp != 1 and tp is not None and etp != tp:
        return f"expert_tp={etp} must be 1 (experts whole, folded over TP) or tp={tp}"
    if not a.folded_experts:
        return None
    if not sh.is_moe:
        return f"expert_tp=1 with tp={tp} folds experts over TP: this model has none; drop it"
    if a.sequence_parallel is False:
        return (
            "expert_tp=1 (experts folded over TP) needs sequence parallelism (each TP rank "
            "dispatches its own tokens, as Megatron-Core requires): use sp=true"
        )
    if a.cp is not None and a.cp > 1:
        return f"expert_tp=1 (experts folded over TP) is priced with cp=1 only; cp={a.cp}"
    if a.ep is not None and tp is not None and a.ep % tp:
        return (
            f"expert_tp=1 with tp={tp} folds the experts' group over the TP ranks: ep={a.ep} "
            "must be a multiple of tp"
        )
    return None


def _zero_stage(sh: ProblemShape, a: Assignment) -> str | None:
    if a.zero_stage is None or a.zero_stage in _ZERO_STAGES:
        return None
    return f"zero_stage={a.zero_stage} must be 0, 1, 2 or 3"


def _hsdp_shards_dp(sh: ProblemShape, a: Assignment) -> str | None:
    shard, dp, zero = a.dp_shard, a.dp, a.zero_stage
    if shard is None:
        return None
    if shard < 2 and dp != shard:
        return (
            f"dp_shard={shard}: an HSDP shard group needs at least 2 ranks (dp_shard=1 is "
            f"plain data parallelism); use dp_shard >= 2 or zero_stage < 3"
        )
    if dp is not None and (shard > dp or dp % shard):
        return (
            f"dp_shard={shard} must divide dp={dp} (HSDP shards over groups of dp_shard ranks "
            f"and replicates across dp // dp_shard); use a divisor of {dp}"
        )
    if zero is not None and zero != 3 and dp is not None and shard < dp:
        return (
            f"dp_shard={shard} below dp={dp} is HSDP, which shards parameters (zero_stage 3), "
            f"but zero_stage={zero}; use zero_stage=3 or dp_shard={dp}"
        )
    return None


def _offload_needs_zero(sh: ProblemShape, a: Assignment) -> str | None:
    if a.offload_optimizer and a.zero_stage == 0:
        return (
            "offload_optimizer needs zero_stage >= 1 (ZeRO-Offload partitions the states); "
            "use zero_stage >= 1 or offload_optimizer=false"
        )
    return None


def _batch_divides(sh: ProblemShape, a: Assignment) -> str | None:
    pairs = _set(a, _FIELDS[Rule.BATCH_DIVIDES])
    if not pairs:
        return None
    total, gb = prod(v for _, v in pairs), sh.global_batch
    if total >= 1 and all(v >= 1 for _, v in pairs) and gb % total == 0:
        return None
    return (
        f"{_product_text(pairs)} must divide the global batch of {gb}; use divisors of "
        f"global_batch={gb}"
    )


def _schedule_matches_pp(sh: ProblemShape, a: Assignment) -> str | None:
    pp, schedule = a.pp, a.schedule
    if pp is None or schedule is None or (pp == 1) == (schedule == Schedule.NONE):
        return None
    return f"schedule={schedule} with pp={pp}: use 'none' exactly when pp=1"


def _virtual_stages_match_schedule(sh: ProblemShape, a: Assignment) -> str | None:
    v, schedule = a.virtual_stages, a.schedule
    if v is None or schedule is None:
        return None
    if schedule in (Schedule.ZBV, Schedule.DUALPIPEV):  # a V: two chunks per stage
        return None if v == 2 else f"{schedule} places two chunks per stage; use vpp=2, not {v}"
    if schedule == Schedule.INTERLEAVED_ZB or (schedule == Schedule.INTERLEAVED_1F1B) == (v > 1):
        return None
    return (
        f"virtual_stages={v} with schedule={schedule}: use virtual_stages > 1 exactly with "
        "interleaved_1f1b"
    )


def _stages_within_blocks(sh: ProblemShape, a: Assignment) -> str | None:
    pairs = _set(a, _FIELDS[Rule.STAGES_WITHIN_BLOCKS])
    if not pairs or prod(v for _, v in pairs) <= sh.num_blocks:
        return None
    return f"{_product_text(pairs)} exceeds the {sh.num_blocks} blocks; use fewer stages"


def _interleaved_microbatches(sh: ProblemShape, a: Assignment) -> str | None:
    dp, mbs, pp = a.dp, a.micro_batch_size, a.pp
    looped = (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.DUALPIPEV)
    if a.schedule not in looped or dp is None or mbs is None or pp is None:
        return None
    if dp < 1 or mbs < 1 or pp < 1:
        return None  # the world size and batch rules name these
    m = sh.global_batch // (dp * mbs)
    if a.schedule == Schedule.DUALPIPEV:  # torch's ScheduleDualPipeV rule
        if m >= 2 * pp:
            return None
        return (
            f"dualpipev needs at least 2*pp={2 * pp} micro-batches, not {m}; lower "
            "micro_batch_size or pick another schedule"
        )
    if m % pp == 0:
        return None
    return (
        f"{a.schedule} needs the {m} micro-batches to be a multiple of pp={pp}; "
        "change micro_batch_size or the schedule"
    )


def _mesh_order(sh: ProblemShape, a: Assignment) -> str | None:
    order = a.mesh_order
    if order is None or (len(order) == len(MeshAxis) and set(order) == _ALL_AXES):
        return None
    return f"mesh_order {[str(x) for x in order]} must order each of pp, dp, cp, tp once"


RULES: tuple[tuple[Rule, Callable[[ProblemShape, Assignment], str | None]], ...] = (
    (Rule.WORLD_SIZE, _world_size),
    (Rule.TP_DIVIDES_MODEL, _tp_divides_model),
    (Rule.TP_FITS_KV_HEADS, _tp_fits_kv_heads),
    (Rule.SP_NEEDS_TP, _sp_needs_tp),
    (Rule.CP_SPLITS_SEQUENCE, _cp_splits_sequence),
    (Rule.EP_NEEDS_MOE, _ep_needs_moe),
    (Rule.EP_DIVIDES, _ep_divides),
    (Rule.EXPERT_TP, _expert_tp),
    (Rule.ZERO_STAGE, _zero_stage),
    (Rule.HSDP_SHARDS_DP, _hsdp_shards_dp),
    (Rule.OFFLOAD_NEEDS_ZERO, _offload_needs_zero),
    (Rule.BATCH_DIVIDES, _batch_divides),
    (Rule.SCHEDULE_MATCHES_PP, _schedule_matches_pp),
    (Rule.VIRTUAL_STAGES_MATCH_SCHEDULE, _virtual_stages_match_schedule),
    (Rule.STAGES_WITHIN_BLOCKS, _stages_within_blocks),
    (Rule.INTERLEAVED_MICROBATCHES, _interleaved_microbatches),
    (Rule.MESH_ORDER, _mesh_order),
)
"""Every rule with its check (message, or None when it can still hold), in `Rule` order."""


def violation(shape: ProblemShape, a: Assignment) -> Violation | None:
    """The first rule `a` breaks for this problem (None if none). For partial pins: the first
    rule that no choice of the unset dimensions can satisfy."""
    for rule, check in RULES:
        message = check(shape, a)
        if message is not None:
            return Violation(rule=rule, message=message)
    return None
