"""Bounds on every number a user gives paraplan, each with the reason for it, checked before any
work: a count past its bound is refused at once with a message naming the value and the limit,
instead of a search, a trace or an allocation that grows with the number.

The limits sit well above the largest published training runs (each bound cites the run it
clears), so they only refuse typing mistakes and hostile input. `check_planning` checks a
model, cluster, training config and pins together; the CLI checks each flag as it parses it
(`Bound.check`), and the plan and profile loaders check the counts in their files.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

if typing.TYPE_CHECKING:
    from .cluster import Cluster
    from .config import TrainConfig
    from .model import ModelProfile
    from .pins import Pins


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """The range of one kind of count, with the reason for its limit."""

    unit: str
    """What is counted, plural ("GPUs", "sequences")."""
    minimum: int
    """Smallest allowed value."""
    maximum: int
    """Largest allowed value."""
    reason: str
    """Why the limit is where it is (the published run it clears)."""

    def check(self, value: object, where: str) -> int:
        """`value` if it is a whole number in range, else ValueError naming `where` (the flag or
        field), the value, the limit and the fix."""
        problem = self.violation(value)
        if problem:
            raise ValueError(f"{where}={show_number(value)} {problem}")
        return typing.cast(int, value)

    def violation(self, value: object) -> str:
        """What is wrong with `value` ("is above the limit of ..."), or "" when it is fine."""
        if isinstance(value, bool) or not isinstance(value, int):
            return (
                f"must be a whole number of {self.unit} from {self.minimum:,} to {self.maximum:,}"
            )
        if value < self.minimum:
            return (
                f"is below the minimum of {self.minimum:,} {self.unit}; give {self.minimum:,} "
                f"to {self.maximum:,}"
            )
        if value > self.maximum:
            return (
                f"is above the limit of {self.maximum:,} {self.unit} ({self.reason}); give at "
                f"most {self.maximum:,}"
            )
        return ""


def show_number(value: object) -> str:
    """A number as text for a message, short even for a huge integer (Python refuses str() of
    an int past 4,300 digits) or float."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}~1e{digits - 1} ({digits} digits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


GPUS = Bound(
    unit="GPUs",
    minimum=1,
    maximum=2**20,
    reason="5x the largest announced training clusters, about 200,000 GPUs",
)
GPUS_PER_NODE = Bound(
    unit="GPUs per node",
    minimum=1,
    maximum=1024,
    reason="the largest NVLink domain announced, NVL576, holds 576 GPUs",
)
GLOBAL_BATCH = Bound(
    unit="sequences",
    minimum=1,
    maximum=2**16,
    reason="the largest published batch, 65,536 sequences (LAMB, You et al. 2020)",
)
BATCH_TOKENS = Bound(
    unit="tokens",
    minimum=1,
    maximum=2**36,
    reason="over 4,000x the 16M tokens per step of Llama 3 405B (Dubey et al. 2024)",
)
SEQ_LEN = Bound(
    unit="tokens",
    minimum=1,
    maximum=2**24,
    reason="above the 10M-token contexts of Gemini 1.5 and Llama 4 Scout",
)
LAYERS = Bound(
    unit="blocks",
    minimum=1,
    maximum=1024,
    reason="the deepest published transformer, DeepNet, has 1,000 layers (Wang et al. 2022)",
)
PIPELINE_STAGES = Bound(
    unit="pipeline stages",
    minimum=1,
    maximum=128,
    reason="twice the deepest published pipeline, 64 stages (Narayanan et al. 2021, 1T model)",
)
HIDDEN = Bound(
    unit="channels",
    minimum=1,
    maximum=2**18,
    reason="10x the widest published model, PaLM 540B's 18,432 (Chowdhery et al. 2022)",
)
HEADS = Bound(
    unit="heads",
    minimum=1,
    maximum=2**14,
    reason="100x the 128 heads of Llama 3 405B",
)
FFN = Bound(
    unit="channels",
    minimum=1,
    maximum=2**20,
    reason="10x the widest published MLP, PaLM 540B's 73,728",
)
VOCAB = Bound(
    unit="tokens",
    minimum=1,
    maximum=2**24,
    reason="64x the largest published vocabularies, about 256K tokens (Gemma)",
)
EXPERTS = Bound(
    unit="experts",
    minimum=0,
    maximum=2**20,
    reason="the million experts of PEER (He 2024), the most published",
)
ACT_DTYPE_BYTES = Bound(unit="bytes", minimum=1, maximum=8, reason="float64 has 8 bytes")
RUNNERS_UP = Bound(
    unit="runners-up", minimum=0, maximum=1000, reason="more would not be read; the JSON keeps them"
)
PROFILE_TOKENS = Bound(
    unit="tokens",
    minimum=1,
    maximum=2**24,
    reason="the tracer makes the batch's token ids on the CPU; 16M tokens are 128 MiB",
)
TRADEOFF_BUDGETS = Bound(
    unit="budgets", minimum=1, maximum=256, reason="each budget is one solve per strategy"
)
MAX_FIGURE = 1e30
"""Largest magnitude of a number in a plan or profile file (FLOPs, bytes, seconds per layer or
per step). The largest real figure, a 405B-parameter step, is about 1e25 FLOPs; the bound keeps
sums and products over layers, micro-batches and GPUs finite."""
MAX_SECONDS = 7 * 24 * 3600.0
"""Longest time limit a user may give a solver (a week)."""


def check_planning(
    profile: ModelProfile, cluster: Cluster, train: TrainConfig, pins: Pins | None = None
) -> None:
    """Every count of a planning request within its bound (ValueError on the first that is
    not): run before any search, so a hostile number is refused at once."""
    check_profile(profile, where="model")
    check_cluster(cluster)
    GLOBAL_BATCH.check(train.global_batch, "global_batch")
    SEQ_LEN.check(train.seq_len, "seq_len")
    if pins is not None and pins.pp is not None:
        PIPELINE_STAGES.check(pins.pp, "--fix pp")


def check_cluster(cluster: Cluster) -> None:
    """The cluster's GPU counts within bounds."""
    where = f"cluster {cluster.name!r}"
    GPUS.check(cluster.num_gpus, f"{where}: GPUs")  # bounds the node count too
    GPUS_PER_NODE.check(cluster.gpus_per_node, f"{where}: gpus_per_node")


def check_profile(profile: ModelProfile, *, where: str) -> None:
    """A model profile's sizes within bounds (`where` prefixes the field names)."""
    LAYERS.check(profile.num_blocks, f"{where}: blocks")
    SEQ_LEN.check(profile.seq_len, f"{where}: seq_len")
    ACT_DTYPE_BYTES.check(profile.act_dtype_bytes, f"{where}: act_dtype_bytes")
    HIDDEN.check(profile.hidden, f"{where}: hidden")
    HEADS.check(profile.heads, f"{where}: heads")
    HEADS.check(profile.kv_heads, f"{where}: kv_heads")
    if profile.head_dim:  # 0: hidden / heads
        HIDDEN.check(profile.head_dim, f"{where}: head_dim")
    FFN.check(profile.ffn, f"{where}: ffn")
    VOCAB.check(profile.vocab, f"{where}: vocab")
    EXPERTS.check(profile.experts, f"{where}: experts")
    top = Bound(unit="experts", minimum=0, maximum=profile.experts, reason="experts per block")
    top.check(profile.top_k, f"{where}: top_k")


def too_large(data: typing.Any, at: tuple[str | int, ...] = ()) -> tuple[str, float] | None:
    """(JSON path, value) of the first number in a parsed document whose magnitude is over
    `MAX_FIGURE`, or None. Recursive: for documents whose depth is already checked."""
    if isinstance(data, int | float) and not isinstance(data, bool):
        if abs(data) > MAX_FIGURE:
            return ".".join(str(p) for p in at) or "(top level)", data
        return None
    items: typing.Iterable[tuple[str | int, typing.Any]] = ()
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    for key, value in items:
        found = too_large(value, (*at, key))
        if found is not None:
            return found
    return None
