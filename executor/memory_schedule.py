"""Run a single-device chain schedule for real: checkpointed segments and offloaded layers.

A solver (`solve_checkpoint_dp`, Rotor: Beaumont et al. 2019, "Optimal checkpointing for
heterogeneous chains", §4) plans which layers of a chain keep what their backward reads and
which are recomputed. `MemorySchedule` is that plan as a typed value; `apply_memory_schedule`
wraps the chain's modules in a `ScheduledChain` whose forward follows it, so that an ordinary
``loss = scheduled(x); loss.backward()`` runs the solver's schedule:

- A checkpointed `Segment` runs inside ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)``: its forward keeps only its input, and the backward recomputes it
  (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", §3). Its `inner`
  segments say how the recomputation runs: Rotor's schedules are trees, so a recomputed
  segment may checkpoint sub-segments again; non-reentrant checkpoints nest.
- A stored segment runs normally (Rotor's F_all).
- An offloaded layer runs under ``torch.autograd.graph.saved_tensors_hooks``: each tensor it
  saves for backward (parameters and buffers excepted) is copied to host memory when saved and
  copied back when the backward reads it (Rhu et al. 2016, "vDNN: Virtualized Deep Neural
  Networks", offloads activations the same way). On CUDA the host copy is pinned and the
  copies are asynchronous on the current stream. On a CPU "device" the host store is NumPy
  memory: torch's tensor storages (what `MemTracker` counts as device memory) no longer hold
  the tensor, and bringing it back allocates a fresh tensor. This models a device whose host
  memory is separate; it frees no real RAM. A storage saved by several layers stays on the
  device unless every layer holding it offloads it.

Schedules come from solver results through `schedule_from_solution` (or `schedule_from_ops`),
and `schedule_ops` turns one back into the operations `simulate` replays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..planner.solvers.graph import TensorPart
from ..planner.solvers.schedule import Backward, Forward, Offload, Op, SolveStatus

_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)
"""Dtypes NumPy holds as they are; others are stored as raw integers of the same width."""
_RAW_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Element size -> integer dtype used to copy the bits of a dtype NumPy lacks (e.g. bf16)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """Layers ``first .. stop-1`` of a chain (0-based) and how their forward runs."""

    first: int
    """First layer of the segment."""
    stop: int
    """One past the last layer."""
    checkpointed: bool = False
    """Run the forward keeping only the segment's input, and recompute it in backward
    (otherwise every layer keeps what its backward reads)."""
    inner: tuple[Segment, ...] = ()
    """For a checkpointed segment: how the recomputation runs, as segments covering
    ``first .. stop-1`` (empty: store all). Empty for a stored segment."""

    @property
    def layers(self) -> range:
        """The layer indices of the segment."""
        return range(self.first, self.stop)


def _check_segments(segments: tuple[Segment, ...], first: int, stop: int, where: str) -> None:
    """Raise ValueError unless `segments` cover first..stop-1 in order, end with a stored
    segment, and every checkpointed segment's `inner` covers it."""
    if not isinstance(segments, tuple) or not segments:
        raise ValueError(
            f"{where}: segments={segments!r} must be a non-empty tuple of Segment covering "
            f"layers {first}..{stop - 1}"
        )
    at = first
    for seg in segments:
        if not isinstance(seg, Segment):
            raise ValueError(f"{where}: {seg!r} is not a Segment; build it with Segment(...)")
        if seg.first != at or not seg.first < seg.stop <= stop:
            raise ValueError(
                f"{where}: segment {seg.first}..{seg.stop - 1} must start at layer {at} and end "
                f"by layer {stop - 1}; segments cover the layers in order, without gaps"
            )
        if seg.checkpointed:
            inner = seg.inner or (Segment(first=seg.first, stop=seg.stop),)
            _check_segments(inner, seg.first, seg.stop, f"{where} > {seg.first}..{seg.stop - 1}")
        elif seg.inner:
            raise ValueError(
                f"{where}: stored segment {seg.first}..{seg.stop - 1} has inner segments; only a "
                "checkpointed segment is recomputed: set checkpointed=True or drop inner"
            )
        at = seg.stop
    if at != stop:
        raise ValueError(
            f"{where}: segments end at layer {at - 1} but must cover up to layer {stop - 1}; "
            "add the missing layers"
        )
    if segments[-1].checkpointed:
        raise ValueError(
            f"{where}: the last segment {segments[-1].first}..{stop - 1} is checkpointed, but "
            "its backward follows at once, so recomputing it gains nothing; store at least the "
            "last layer (Rotor's schedules always do)"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySchedule:
    """How one training step of a chain runs on one device: which segments are checkpointed
    (and how they are recomputed) and which layers offload what they save."""

    num_layers: int
    """Length of the chain the schedule was made for."""
    segments: tuple[Segment, ...]
    """Segments covering layers ``0 .. num_layers-1`` in order; the last one is stored."""
    offload: frozenset[int] = field(default_factory=frozenset)
    """Layers whose saved tensors go to host memory until their backward; each must be in a
    stored top-level segment (a recomputed layer's tensors exist only just before its
    backward, so there is nothing to offload)."""

    def __post_init__(self) -> None:
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ValueError(
                f"num_layers={self.num_layers!r} must be an integer >= 1 (the chain's length)"
            )
        _check_segments(self.segments, 0, self.num_layers, "MemorySchedule")
        if not isinstance(self.offload, frozenset):
            raise ValueError(
                f"offload={self.offload!r} must be a frozenset of layer indices; pass "
                "frozenset({...})"
            )
        stored = {i for seg in self.segments if not seg.checkpointed for i in seg.layers}
        bad = sorted(i for i in self.offload if i not in stored)
        if bad:
            raise ValueError(
                f"offload has layers {bad}, which are not in a stored top-level segment of the "
                f"{self.num_layers}-layer chain; offload only layers in 0..{self.num_layers - 1} "
                "that are not checkpointed (a recomputed layer saves its tensors just before its "
                "backward)"
            )

    @classmethod
    def store_all(cls, num_layers: int, *, offload: frozenset[int] = frozenset()) -> MemorySchedule:
        """Every layer keeps what its backward reads (no recomputation)."""
        return cls(
            num_layers=num_layers, segments=(Segment(first=0, stop=num_layers),), offload=offload
        )

    @property
    def checkpointed_layers(self) -> frozenset[int]:
        """Layers whose first forward keeps nothing (they are recomputed at least once)."""
        return frozenset(i for seg in self.segments if seg.checkpointed for i in seg.layers)


# ---- from solver operations -----------------------------------------------------------------
def schedule_from_solution(solution: Any, num_layers: int) -> MemorySchedule:
    """The `MemorySchedule` of a solver result for a chain of `num_layers` layers: a
    `ChainSolution` (`solve_checkpoint_dp`) or a chain `RematSolution` (`solve_remat_ilp`)
    whose recomputations form a Rotor tree (see `schedule_from_ops`)."""
    status = getattr(solution, "status", None)
    ops = getattr(solution, "ops", None)
    if status is None or ops is None:
        raise ValueError(
            f"solution={type(solution).__name__} has no status and ops; pass the result of "
            "solve_checkpoint_dp or solve_remat_ilp"
        )
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE) or not ops:
        least = getattr(solution, "min_budget_bytes", None)
        hint = f" (the smallest budget that fits is {least:.6g} bytes)" if least else ""
        raise ValueError(
            f"solution status is {str(status)!r} for budget_bytes="
            f"{getattr(solution, 'budget_bytes', None)!r}{hint}: it has no schedule to run; "
            "raise the budget or give the solver more time, and solve again"
        )
    return schedule_from_ops(ops, num_layers)


def schedule_from_ops(ops: Sequence[Op], num_layers: int) -> MemorySchedule:
    """Parse a chain schedule (ops on `chain_to_graph(chain)`: node l is layer l-1) into a
    `MemorySchedule`.

    The recomputations must form one of Rotor's persistent schedules (Beaumont et al. 2019 §3,
    what `tree_ops` emits): a segment s..t runs layer s keeping its saved tensors (F_all), then
    s+1..t, then B_s; or runs s..s'-1 keeping nothing (F_none), then s'..t, then s..s'-1 again.
    `Offload` of a node's saved tensor offloads that layer; `Offload` of node l's output
    offloads layer l, which saves it for its backward. `Prefetch` and `Wait` are implied (the
    backward brings tensors back when it reads them) and ignored.
    """
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers={num_layers!r} must be an integer >= 1")
    compute: list[tuple[int, Forward | Backward]] = []
    offload: set[int] = set()
    for index, op in enumerate(ops):
        if isinstance(op, Forward | Backward):
            compute.append((index, op))
        elif isinstance(op, Offload):
            layer = op.node - 1 if op.part == TensorPart.SAVED else op.node
            if 0 <= layer < num_layers:
                offload.add(layer)
    nodes = {op.node for _, op in compute}
    if not nodes or max(nodes) != num_layers or min(nodes) < 1:
        covered = f"nodes {min(nodes)}..{max(nodes)}" if nodes else "no layers"
        raise ValueError(
            f"the schedule runs {covered} but the chain has {num_layers} layers (nodes "
            f"1..{num_layers}); solve for this chain, or pass its num_layers"
        )
    parser = _TreeParser(compute)
    segments = parser.segment(1, num_layers)
    if parser.pos != len(compute):
        index, op = compute[parser.pos]
        raise ValueError(
            f"op {index} ({op!r}) comes after the schedule of the whole chain ended; a Rotor "
            "schedule runs every backward once, so remove the extra operations"
        )
    return MemorySchedule(num_layers=num_layers, segments=segments, offload=frozenset(offload))


class _TreeParser:
    """Reads Rotor's tree back from its operations (1-based nodes, see `schedule_from_ops`)."""

    def __init__(self, compute: list[tuple[int, Forward | Backward]]) -> None:
        self.ops = compute
        self.pos = 0

    def _fail(self, expected: str) -> ValueError:
        if self.pos >= len(self.ops):
            where = "the schedule ends"
        else:
            index, op = self.ops[self.pos]
            where = f"op {index} is {op!r}"
        return ValueError(
            f"{where}, where {expected} was expected: the recomputations are not a Rotor "
            "tree (persistent schedule) that torch.utils.checkpoint can run; pass a schedule "
            "of solve_checkpoint_dp or uniform_schedule"
        )

    def _take(
        self, kind: type[Forward] | type[Backward], node: int, keep: bool | None = None
    ) -> None:
        """Consume the next op if it is `kind` on `node` (a Forward with `keep_saved=keep`)."""
        op = self.ops[self.pos][1] if self.pos < len(self.ops) else None
        if (
            isinstance(op, kind)
            and op.node == node
            and (keep is None or getattr(op, "keep_saved", None) == keep)
        ):
            self.pos += 1
            return
        what = f"{kind.__name__}(node={node}" + ("" if keep is None else f", keep_saved={keep}")
        raise self._fail(what + ")")

    def _split(self, s: int, t: int) -> int:
        """First node of the right part after an F_none run from node s: the left part starts
        with the next Forward(s), right after the right part's last Backward(s')."""
        for j in range(self.pos + 1, len(self.ops)):
            op = self.ops[j][1]
            if isinstance(op, Forward) and op.node == s:
                prev = self.ops[j - 1][1]
                if isinstance(prev, Backward) and s < prev.node <= t:
                    return prev.node
                break
        raise self._fail(
            f"a run of Forward(keep_saved=False) from node {s} followed by its recomputation"
        )

    def segment(self, s: int, t: int) -> tuple[Segment, ...]:
        """Segments (0-based layers) for nodes s..t, consuming their operations: first the
        forward sweep (stored nodes and F_none runs, up to the leaf t), then, in reverse, a
        Backward per stored node and the recomputation of each run."""
        runs: list[tuple[int, int, bool]] = []  # (first node, stop node, checkpointed)
        node = s
        while True:
            op = self.ops[self.pos][1] if self.pos < len(self.ops) else None
            if isinstance(op, Forward) and op.node == node and not op.keep_saved and node < t:
                split = self._split(node, t)
                for k in range(node, split):
                    self._take(Forward, k, keep=False)
                runs.append((node, split, True))
                node = split
                continue
            self._take(Forward, node, keep=True)
            runs.append((node, node + 1, False))
            if node == t:
                break
            node += 1
        inner: dict[int, tuple[Segment, ...]] = {}
        for first, stop, checkpointed in reversed(runs):
            if checkpointed:
                inner[first] = _simplify(self.segment(first, stop - 1))
            else:
                self._take(Backward, first)
        return _merge(
            Segment(
                first=first - 1,
                stop=stop - 1,
                checkpointed=checkpointed,
                inner=inner.get(first, ()) if checkpointed else (),
            )
            for first, stop, checkpointed in runs
        )


def _merge(segments: Iterable[Segment]) -> tuple[Segment, ...]:
    """Join consecutive stored segments."""
    out: list[Segment] = []
    for seg in segments:
        if out and not seg.checkpointed and not out[-1].checkpointed:
            out[-1] = Segment(first=out[-1].first, stop=seg.stop)
        else:
            out.append(seg)
    return tuple(out)


def _simplify(inner: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """An inner schedule that stores everything is written as ``()``."""
    return () if len(inner) == 1 and not inner[0].checkpointed else inner


def schedule_ops(schedule: MemorySchedule) -> list[Op]:
    """The chain operations `schedule` runs (node l is layer l-1), for `simulate`: its first
    forward sweep, then backwards in reverse order, each checkpointed segment recomputed (by its
    inner schedule) right after the backward that follows it. Offloads are not written out."""
    return _segment_ops(schedule.segments)


def _segment_ops(segments: tuple[Segment, ...]) -> list[Op]:
    ops: list[Op] = []
    tail: list[Segment | int] = []
    for seg in segments:
        for k in seg.layers:
            ops.append(Forward(node=k + 1, keep_saved=not seg.checkpointed))
            if not seg.checkpointed:
                tail.append(k)
        if seg.checkpointed:
            tail.append(seg)
    for item in reversed(tail):
        if isinstance(item, Segment):
            ops += _segment_ops(item.inner or (Segment(first=item.first, stop=item.stop),))
        else:
            ops.append(Backward(node=item + 1))
    return ops


# ---- offload --------------------------------------------------------------------------------
def _is_dense(t: torch.Tensor) -> bool:
    """Whether `t`'s strides lay its elements out without gaps or overlaps, in any order."""
    expected = 1
    for stride, size in sorted(
        (st, n) for n, st in zip(t.size(), t.stride(), strict=True) if n != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _empty(
    size: torch.Size, stride: tuple[int, ...] | None, dtype: torch.dtype, *, pin: bool = False
) -> torch.Tensor:
    """An uninitialized CPU tensor with these strides (None: contiguous)."""
    if stride is None:
        return torch.empty(size, dtype=dtype, pin_memory=pin)
    return torch.empty_strided(size, stride, dtype=dtype, pin_memory=pin)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """`t` (on the CPU) as a NumPy array sharing its memory; dtypes NumPy lacks as raw bits."""
    if t.dtype not in _NUMPY_DTYPES:
        t = t.view(_RAW_DTYPES[t.element_size()])
    return t.numpy()


@dataclass(frozen=True, slots=True)
class _HostCopy:
    """A saved tensor held in host memory."""

    data: Any
    """NumPy array (CPU device) or CPU tensor, pinned for CUDA."""
    size: torch.Size
    stride: tuple[int, ...] | None
    """Strides to restore (None: contiguous)."""
    dtype: torch.dtype
    device: torch.device


class _HostStore:
    """saved_tensors_hooks that keep saved tensors in host memory (see the module docstring)."""

    def __init__(self, keep: set[int]) -> None:
        self.keep = keep
        """Storage addresses that stay on the device (parameters and buffers)."""

    def pack(self, t: torch.Tensor) -> Any:
        """Copy `t` to the host, unless it is empty or a parameter's or buffer's."""
        if t.numel() == 0 or t.device.type == "meta" or t.untyped_storage().data_ptr() in self.keep:
            return t
        stride = tuple(t.stride()) if _is_dense(t) else None
        data: Any
        if t.device.type == "cpu":
            data = np.array(_numpy_view(t.detach()), order="C", copy=True)  # (*size,)
        elif t.device.type == "cuda":
            data = _empty(t.size(), stride, t.dtype, pin=True)
            data.copy_(t.detach(), non_blocking=True)
        else:
            data = t.detach().to("cpu")
        return _HostCopy(data, t.size(), stride, t.dtype, t.device)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        """Bring a packed tensor back to its device (a fresh allocation there)."""
        if isinstance(packed, torch.Tensor):
            return packed
        if isinstance(packed.data, np.ndarray):
            out = _empty(packed.size, packed.stride, packed.dtype)
            np.copyto(_numpy_view(out), packed.data)
            return out
        return packed.data.to(packed.device, non_blocking=True)


# ---- the module -----------------------------------------------------------------------------
class ScheduledChain(nn.Module):
    """A chain of modules (layer i reads layer i-1's output; the last returns the loss) whose
    forward follows a `MemorySchedule`, so that its backward recomputes and brings back
    tensors as planned. Parameters are the layers' own (``layers.<i>.`` names)."""

    def __init__(self, layers: Sequence[nn.Module], schedule: MemorySchedule) -> None:
        super().__init__()
        _check_chain(layers, schedule)
        self.layers = nn.ModuleList(layers)
        self.schedule = schedule

    def forward(self, x: torch.Tensor) -> Any:
        """Run the chain on `x` (the first layer's input) as the schedule says."""
        store = None
        if self.schedule.offload:
            keep = {t.untyped_storage().data_ptr() for t in [*self.parameters(), *self.buffers()]}
            store = _HostStore(keep)
        return self._run(self.schedule.segments, x, store)

    def _run(self, segments: tuple[Segment, ...], x: Any, store: _HostStore | None) -> Any:
        for seg in segments:
            if seg.checkpointed:
                inner = seg.inner or (Segment(first=seg.first, stop=seg.stop),)
                x = checkpoint(self._run, inner, x, store, use_reentrant=False)
                continue
            for i in seg.layers:
                if store is not None and i in self.schedule.offload:
                    with torch.autograd.graph.saved_tensors_hooks(store.pack, store.unpack):
                        x = self.layers[i](x)
                else:
                    x = self.layers[i](x)
        return x


def _check_chain(layers: Sequence[nn.Module], schedule: MemorySchedule) -> None:
    if not isinstance(schedule, MemorySchedule):
        raise ValueError(
            f"schedule={type(schedule).__name__} is not a MemorySchedule; build one with "
            "schedule_from_solution(solution, len(layers))"
        )
    if isinstance(layers, nn.Module) and not isinstance(layers, nn.Sequential | nn.ModuleList):
        raise ValueError(
            f"layers={type(layers).__name__} must be a sequence of modules forming a chain; "
            "pass e.g. list(model.children()) or an nn.Sequential"
        )
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ValueError(
                f"layers[{i}]={layer!r} is not an nn.Module; wrap the callable in a module"
            )
    if len(layers) != schedule.num_layers:
        raise ValueError(
            f"the schedule is for a chain of {schedule.num_layers} layers but {len(layers)} "
            "modules were given; solve for this chain (profile_chain over the same modules) or "
            "pass the modules the schedule was made for"
        )


def apply_memory_schedule(layers: Sequence[nn.Module], schedule: MemorySchedule) -> ScheduledChain:
    """Wrap `layers` (a chain: layer i reads layer i-1's output, the last returns the loss) in
    a `ScheduledChain` that checkpoints and offloads as `schedule` says. The modules are
    shared, not copied."""
    return ScheduledChain(layers, schedule)
