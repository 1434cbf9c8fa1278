"""`--fix` pins: dimensions of the strategy the user fixes; the search chooses the rest."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .strategy import Recompute, Schedule, Strategy

FIX_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "expert_tp",
    "zero_stage",
    "dp_shard",
    "sequence_parallel",
    "virtual_stages",
    "micro_batch_size",
    "schedule",
    "recompute",
    "offload_optimizer",
    "powersgd_rank",
    "offload_params",
    "offload_activations",
    "async_pipeline",
)
"""The pinnable dimensions, by their plan-JSON names, in the order `describe` writes them."""
FIX_ALIASES = {
    "etp": "expert_tp",
    "zero": "zero_stage",
    "sp": "sequence_parallel",
    "vpp": "virtual_stages",
    "mbs": "micro_batch_size",
    "offload": "offload_optimizer",
    "powersgd": "powersgd_rank",
    "offload_acts": "offload_activations",
    "async": "async_pipeline",
}
"""Short names `--fix` accepts for some keys."""
PINNED_FOR_SINGLE = frozenset(
    {"dp", "tp", "pp", "zero_stage", "micro_batch_size", "schedule", "recompute"}
)
"""Pinning these evaluates one configuration (cp, ep, sp, offload still take their best)."""
_INT_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "expert_tp",
    "zero_stage",
    "dp_shard",
    "virtual_stages",
    "micro_batch_size",
    "powersgd_rank",
)
_BOOL_KEYS = (
    "sequence_parallel",
    "offload_optimizer",
    "offload_params",
    "offload_activations",
    "async_pipeline",
)
_ZERO_STAGES = (0, 1, 2, 3)
_BOOL_WORDS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}
FIX_FORMS = (
    "comma-separated key=value pairs, e.g. 'tp=8,pp=8,dp=24,zero=1,mbs=2,schedule=1f1b,"
    "recompute=full'; keys: "
    + ", ".join(FIX_KEYS)
    + " (aliases: "
    + ", ".join(f"{a}={k}" for a, k in FIX_ALIASES.items())
    + "); schedules: "
    + ", ".join(s.value for s in Schedule)
    + "; recompute: "
    + ", ".join(r.value for r in Recompute)
)
"""What `--fix` accepts, for error messages and `--help`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Pins:
    """Pinned dimensions of the strategy (None: left to the search). Names follow `Strategy`
    and the plan JSON."""

    dp: int | None = None
    """Data-parallel degree."""
    tp: int | None = None
    """Tensor-parallel degree."""
    pp: int | None = None
    """Pipeline stages."""
    cp: int | None = None
    """Context-parallel degree."""
    ep: int | None = None
    """Expert-parallel degree (MoE only)."""
    expert_tp: int | None = None
    """Tensor-parallel degree of the experts: tp (split as the dense layers) or 1 (whole, the
    expert-parallel group folded over the TP ranks)."""
    zero_stage: int | None = None
    """ZeRO stage, 0 to 3."""
    dp_shard: int | None = None
    """Data-parallel ranks of one ZeRO-3 shard group (HSDP when below dp; dp: plain FSDP)."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism (needs tp > 1)."""
    virtual_stages: int | None = None
    """Model chunks per pipeline rank (interleaved 1F1B)."""
    micro_batch_size: int | None = None
    """Sequences per micro-batch."""
    schedule: Schedule | None = None
    """Pipeline schedule."""
    recompute: Recompute | None = None
    """Activation recomputation policy."""
    offload_optimizer: bool | None = None
    """Optimizer states and step on the host (needs zero_stage >= 1)."""
    powersgd_rank: int | None = None
    """PowerSGD rank of the gradient all-reduce (pinning it opts in to compression)."""
    offload_params: bool | None = None
    """Parameter and gradient shards on the host (ZeRO-3 with optimizer offload)."""
    offload_activations: bool | None = None
    """Blocks' saved activations on the host."""
    async_pipeline: bool | None = None
    """PipeDream-2BW asynchronous 1F1B (pinning it true opts in to weight staleness 1)."""

    def __post_init__(self) -> None:
        for key in _INT_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if type(value) is not int:
                raise ValueError(f"pin {key}={value!r} must be an int (or None to search it)")
            if key == "zero_stage" and value not in _ZERO_STAGES:
                raise ValueError(f"pin zero_stage={value} must be 0, 1, 2 or 3")
            if key != "zero_stage" and value < 1:
                raise ValueError(f"pin {key}={value} must be a positive integer")
        for key in _BOOL_KEYS:
            value = getattr(self, key)
            if value is not None and type(value) is not bool:
                raise ValueError(f"pin {key}={value!r} must be True or False (or None)")
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise ValueError(
                f"pin schedule={self.schedule!r} must be a Schedule, e.g. Schedule("
                f"{str(self.schedule)!r}); use Pins.parse for text"
            )
        if self.recompute is not None and not isinstance(self.recompute, Recompute):
            raise ValueError(
                f"pin recompute={self.recompute!r} must be a Recompute, e.g. Recompute("
                f"{str(self.recompute)!r}); use Pins.parse for text"
            )

    @classmethod
    def parse(cls, text: str) -> Pins:
        """Parse `--fix` text (see `FIX_FORMS`); errors name the bad token."""
        values: dict[str, Any] = {}  # typed by _parse_value, checked by __post_init__
        for token in filter(None, (t.strip() for t in text.split(","))):
            raw_key, eq, raw = token.partition("=")
            key = FIX_ALIASES.get(raw_key.strip().lower(), raw_key.strip().lower())
            raw = raw.strip().lower()
            if not eq or not raw:
                raise ValueError(f"--fix: bad token {token!r}; expected {FIX_FORMS}")
            if key not in FIX_KEYS:
                raise ValueError(
                    f"--fix: unknown key {raw_key.strip()!r} in {token!r}; {FIX_FORMS}"
                )
            value = _parse_value(key, raw, token)
            if key in values and values[key] != value:
                raise ValueError(f"--fix: {key} given twice with different values")
            values[key] = value
        return cls(**values)

    @classmethod
    def of(cls, s: Strategy) -> Pins:
        """Every dimension of `s` pinned (its mesh order is left to the search)."""
        return cls(
            dp=s.dp,
            tp=s.tp,
            pp=s.pp,
            cp=s.cp,
            ep=s.ep,
            expert_tp=1 if s.folded_experts else s.tp,
            zero_stage=s.zero_stage,
            dp_shard=s.shard_dp,
            sequence_parallel=s.sequence_parallel,
            virtual_stages=s.virtual_stages,
            micro_batch_size=s.micro_batch_size,
            schedule=s.schedule,
            recompute=s.recompute,
            offload_optimizer=s.offload_optimizer,
            powersgd_rank=s.powersgd_rank,
            offload_params=s.offload_params,
            offload_activations=s.offload_activations,
            async_pipeline=s.async_pipeline,
        )

    @property
    def folded_experts(self) -> bool | None:
        """Whether the pins fold the experts over TP (`Strategy.folded_experts`; None: the
        search may or may not)."""
        if self.expert_tp is None or (self.expert_tp == 1 and self.tp is None):
            return None
        return self.expert_tp == 1 and self.tp is not None and self.tp > 1

    @property
    def mesh_order(self) -> None:
        """Pins never fix the mesh order: the search takes each candidate's fastest."""
        return None

    def pinned(self) -> tuple[str, ...]:
        """Names of the pinned dimensions, in `FIX_KEYS` order."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)

    def describe(self, keys: tuple[str, ...] | None = None) -> str:
        """The pins (or those of `keys` that are pinned) in `--fix` form, e.g.
        ``tp=2,zero_stage=1,offload_optimizer=false`` ('' when none)."""
        names = self.pinned() if keys is None else [k for k in self.pinned() if k in keys]
        return ",".join(f"{k}={_word(getattr(self, k))}" for k in names)

    @property
    def all_pinned(self) -> bool:
        """Whether every main dimension is pinned: then a plan is reported even when it does
        not fit (the least-memory variant of what remains, marked infeasible)."""
        return set(self.pinned()) >= PINNED_FOR_SINGLE


def _word(value: object) -> str:
    """A pinned value as `--fix` writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_value(key: str, raw: str, token: str) -> object:
    """The typed value of one `--fix` token (`raw` lower-cased)."""
    if key in _INT_KEYS:
        if key == "zero_stage" and raw not in ("0", "1", "2", "3"):
            raise ValueError(f"--fix: {token!r}: zero_stage must be 0, 1, 2 or 3")
        if key != "zero_stage" and (not raw.isdigit() or int(raw) < 1):
            raise ValueError(f"--fix: {token!r}: {key} must be a positive integer")
        return int(raw)
    if key in _BOOL_KEYS:
        if raw not in _BOOL_WORDS:
            raise ValueError(f"--fix: {token!r}: {key} must be true or false")
        return _BOOL_WORDS[raw]
    if key == "schedule":
        try:
            return Schedule(raw)
        except ValueError:
            raise ValueError(
                f"--fix: {token!r}: unknown schedule; use one of "
                + ", ".join(s.value for s in Schedule)
            ) from None
    try:
        return Recompute(raw)
    except ValueError:
        raise ValueError(
            f"--fix: {token!r}: unknown recompute policy; use one of "
            + ", ".join(r.value for r in Recompute)
        ) from None
