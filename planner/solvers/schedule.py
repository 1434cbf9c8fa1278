"""Schedules: the operations a solver emits and the simulator replays, and solver statuses.

A schedule is a sequence of operations on an op graph (a chain is the path graph of
`chain_to_graph`, where node l is layer l-1 and node 0 the chain's input):

- `Forward(node, keep_saved)`: run the node's forward; with `keep_saved` also keep the private
  tensor its backward reads (Rotor's F_all; without it, Rotor's F_ck/F_none, Beaumont et al.
  2019 §3). Running it again later is a recomputation.
- `Backward(node)`: run the node's backward (once per node, after all its consumers').
- `Offload(node, part, fraction, release)`: copy (a slice of) a tensor to the host over the
  transfer channel; `release` frees the device copy once the whole tensor is on the host.
- `Prefetch(node, part, fraction)`: copy (a slice of) it back; the first slice allocates the
  device buffer, the tensor is usable once all slices arrived.
- `Wait()`: the compute stream waits for every transfer issued so far.

Slices let a transfer use the channel while several operations compute (Beaumont et al. 2021,
"Efficient Combination of Rematerialization and Offloading for Training DNNs", §3, also let
transfers overlap computations freely).

Tensors are freed right after their last use (the simulator computes liveness), so a schedule
never says "free". Memory of a transfer: see `simulator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .graph import OpGraph, TensorPart


class SolveStatus(StrEnum):
    """Outcome of a solver."""

    OPTIMAL = "optimal"
    """Proven optimal (for the DP: for memory discretized into its units)."""
    FEASIBLE = "feasible"
    """A valid schedule within the budget whose optimality is not proven (see the gap)."""
    INFEASIBLE = "infeasible"
    """No schedule fits the budget; the result says the smallest budget that works."""
    TIME_LIMIT = "time_limit"
    """The ILP's time limit ran out before it found a schedule or proved there is none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Forward:
    """Run a node's forward; `keep_saved` keeps the private tensor its backward reads."""

    node: int
    """Graph node index."""
    keep_saved: bool = True
    """Keep the node's private saved tensor (Rotor's "store all")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Backward:
    """Run a node's backward."""

    node: int
    """Graph node index."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Offload:
    """Copy (a slice of) a tensor to the host (device to host)."""

    node: int
    """Graph node index."""
    part: TensorPart = TensorPart.OUTPUT
    """Which of the node's tensors."""
    fraction: float = 1.0
    """Share of the tensor this copy moves (slices of one offload add up to 1)."""
    release: bool = True
    """Free the device copy at the next wait; needs all slices issued."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefetch:
    """Copy (a slice of) a tensor back from the host (host to device)."""

    node: int
    """Graph node index."""
    part: TensorPart = TensorPart.OUTPUT
    """Which of the node's tensors."""
    fraction: float = 1.0
    """Share of the tensor this copy moves (0 only reserves the device buffer)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Wait:
    """The compute stream waits for every transfer issued so far."""


Op = Forward | Backward | Offload | Prefetch | Wait
"""One schedule operation."""


def overhead(makespan_s: float | None, store_all_makespan_s: float) -> float | None:
    """A schedule's makespan over the no-recomputation time, minus 1 (None: no schedule)."""
    if makespan_s is None:
        return None
    return makespan_s / store_all_makespan_s - 1.0


def format_schedule(graph: OpGraph, ops: tuple[Op, ...] | list[Op]) -> str:
    """A one-line human rendering: ``F*name`` keeps saved tensors, ``F name`` does not,
    ``B name`` backward, ``>name``/``<name`` offload/prefetch, ``|`` wait."""
    words = []
    for op in ops:
        if isinstance(op, Forward):
            words.append(("F*" if op.keep_saved else "F ") + graph.nodes[op.node].name)
        elif isinstance(op, Backward):
            words.append("B " + graph.nodes[op.node].name)
        elif isinstance(op, Offload | Prefetch):
            mark = ">" if isinstance(op, Offload) else "<"
            suffix = "" if op.part == TensorPart.OUTPUT else ".saved"
            words.append(mark + graph.nodes[op.node].name + suffix)
        else:
            words.append("|")
    return "  ".join(words)
