"""Replay a schedule on an op graph (or chain) and measure its peak memory and makespan.

The ground truth every solver is checked against. Semantics:

- Memory: graph inputs are present at the start. A `Forward` allocates the node's output (and
  its private saved tensor with `keep_saved`) plus `fwd_tmp_bytes` while it runs; a `Backward`
  allocates the gradient buffers of the node's inputs that do not exist yet plus
  `bwd_tmp_bytes`, then frees the node's output gradient and its private saved tensor. The
  gradient seeds (one per sink, the size of its output) are allocated right before the first
  `Backward`. Every tensor is freed right after its last use before it is produced again
  (liveness), as PyTorch frees a tensor when its last reference goes.
- Time: operations run back to back on one compute stream. Transfers (`Offload`, `Prefetch`)
  run one after the other on one channel of `pcie_bytes_per_s`, starting when issued or when the
  channel is free, overlapping compute.
- Transfers and memory: the compute stream learns that transfers completed when it waits for
  the channel (a `Wait`, or an implicit wait when an operation needs a tensor still arriving:
  the simulator then waits for all issued transfers), as a program calling `wait_stream` on
  the copy stream does. A tensor being offloaded stays on the device, readable, until that
  wait; then, once all its slices are copied, the host copy is valid and, if the offload says
  `release`, the device copy is freed. A prefetch allocates the device buffer with its first
  slice; the tensor is usable after the wait that follows its last slice.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .chain import LayerChain
from .graph import OpGraph, TensorPart, chain_to_graph
from .schedule import Backward, Forward, Offload, Op, Prefetch, Wait

Key = tuple[int, TensorPart]
_TOL = 1e-9
"""Slices whose fractions add up to within this of 1 make a whole tensor."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimResult:
    """What a replay measured."""

    peak_bytes: float
    """Highest device memory at any instant (inputs, activations, gradients, transients)."""
    makespan_s: float
    """Time from the first operation until the compute stream finishes the last one."""
    compute_s: float
    """Sum of forward and backward times (recomputations included)."""
    recompute_s: float
    """Forward time beyond one run per node."""
    stall_s: float
    """Time the compute stream waited for the transfer channel."""
    transfer_bytes: float
    """Bytes moved over the channel (both directions)."""
    peak_op: int | None
    """Index of the operation during which the peak happened (None: at the start)."""


def simulate(
    model: OpGraph | LayerChain, ops: Sequence[Op], *, pcie_bytes_per_s: float | None = None
) -> SimResult:
    """Replay `ops` on `model` (a chain is replayed as `chain_to_graph(chain)`).

    Raises ValueError naming the operation if the schedule is invalid: a tensor used while not
    on the device, a node recomputed while its output is still there, a backward before its
    consumers' or without a forward, a missing backward, or a transfer without a bandwidth.
    """
    graph = chain_to_graph(model) if isinstance(model, LayerChain) else model
    return _Replay(graph, ops, pcie_bytes_per_s).run()


@functools.lru_cache(maxsize=32)
def _structure(graph: OpGraph) -> tuple[Any, ...]:
    """Per-node facts a replay reads, computed once per graph (brute force replays thousands
    of schedules of one graph)."""
    n = range(len(graph))
    users = graph.consumers()
    sinks = [i for i in graph.compute_nodes if not users[i]]
    return (
        users,
        [graph.bwd_reads(i) for i in n],
        [graph.holds(i) for i in n],
        [graph.has_saved(i) for i in n],
        sinks,
    )


class _Replay:
    """State of one replay (see the module docstring for the semantics)."""

    def __init__(self, graph: OpGraph, ops: Sequence[Op], bw: float | None) -> None:
        if bw is not None and not bw > 0:
            raise ValueError(f"pcie_bytes_per_s={bw!r} must be > 0; pass e.g. 25e9 or None")
        self.graph, self.ops, self.bw = graph, list(ops), bw
        self.users, self.reads, self.holds, self.has_saved, self.sinks = _structure(graph)
        self.device: dict[Key, float] = {}
        self.inflight: dict[Key, float] = {}  # prefetches in progress: share arrived so far
        self.sent: dict[Key, float] = {}  # share of each device tensor copied to the host
        self.reading: set[Key] = set()  # offloads issued since the last wait
        self.releasing: set[Key] = set()
        self.dead: set[Key] = set()
        self.host: set[Key] = set()
        self.grads: dict[int, float] = {}
        self.pins: dict[int, set[int]] = {}
        self.mem = self.peak = 0.0
        self.peak_op: int | None = None
        self.index = -1
        self.now = self.chan_free = self.stall = self.compute = self.recompute = 0.0
        self.moved = 0.0

    def run(self) -> SimResult:
        graph = self.graph
        free_after = self._liveness()
        for i in range(len(graph)):
            if graph.nodes[i].is_input:
                self._alloc((i, TensorPart.OUTPUT), graph.nodes[i].output_bytes)
        self.peak = self.mem
        for key in free_after.get(-1, ()):
            self._release(key)
        runs = [0] * len(graph)
        done = [False] * len(graph)
        seeded = False
        for index, op in enumerate(self.ops):
            self.index = index
            if isinstance(op, Forward):
                self._forward(op, runs)
            elif isinstance(op, Backward):
                if not seeded:
                    for sink in self.sinks:
                        self.grads[sink] = graph.nodes[sink].output_bytes
                        self.mem += graph.nodes[sink].output_bytes
                    self._note(self.mem)
                    seeded = True
                self._backward(op, runs, done)
            elif isinstance(op, Offload | Prefetch):
                self._transfer(op)
            elif isinstance(op, Wait):
                self._sync()
            else:
                raise ValueError(f"op {index}: {op!r} is not a schedule operation")
            for key in free_after.get(index, ()):
                self._release(key)
        missing = [graph.nodes[i].name for i in graph.compute_nodes if not done[i]]
        if missing:
            raise ValueError(
                f"schedule ends before the backward of {missing}; add a Backward for each"
            )
        return SimResult(
            peak_bytes=self.peak,
            makespan_s=self.now,
            compute_s=self.compute,
            recompute_s=self.recompute,
            stall_s=self.stall,
            transfer_bytes=self.moved,
            peak_op=self.peak_op,
        )

    # ---- liveness -------------------------------------------------------------------------
    def _liveness(self) -> dict[int, list[Key]]:
        """Op index after which each tensor instance dies (its last use before the next
        production; right after the production if it is never used). Further slices of a
        prefetch in progress are uses, not productions."""
        last: dict[Key, int] = {}
        free_after: dict[int, list[Key]] = {}
        arriving: dict[Key, float] = {}
        for i, node in enumerate(self.graph.nodes):
            if node.is_input:
                last[(i, TensorPart.OUTPUT)] = -1
        for index, op in enumerate(self.ops):
            produced: list[Key] = []
            if isinstance(op, Forward):
                node = self.graph.nodes[op.node]
                for i in node.inputs:
                    last[(i, TensorPart.OUTPUT)] = index
                produced = [(op.node, TensorPart.OUTPUT)]
                if op.keep_saved and self.graph.has_saved(op.node):
                    produced.append((op.node, TensorPart.SAVED))
            elif isinstance(op, Backward):
                for key in self.reads[op.node]:
                    last[key] = index
            elif isinstance(op, Offload):
                last[(op.node, op.part)] = index
            elif isinstance(op, Prefetch):
                key = (op.node, op.part)
                if key in arriving:
                    last[key] = index
                else:
                    produced, arriving[key] = [key], 0.0
                arriving[key] += op.fraction
                if arriving[key] >= 1 - _TOL:
                    del arriving[key]
            for key in produced:
                if key in last:
                    free_after.setdefault(last[key], []).append(key)
                last[key] = index
        for key, index in last.items():
            free_after.setdefault(index, []).append(key)
        return free_after

    # ---- memory ---------------------------------------------------------------------------
    def _note(self, level: float) -> None:
        if level > self.peak:
            self.peak, self.peak_op = level, self.index

    def _alloc(self, key: Key, size: float) -> None:
        self.device[key] = size
        self.mem += size
        if key[1] == TensorPart.SAVED and self.holds[key[0]]:
            for i in self.holds[key[0]]:
                self.pins.setdefault(i, set()).add(key[0])

    def _drop(self, key: Key) -> None:
        self.mem -= self.device.pop(key)
        if key[1] == TensorPart.SAVED and self.holds[key[0]]:
            for i in self.holds[key[0]]:
                self.pins[i].discard(key[0])

    def _release(self, key: Key) -> None:
        """Free a dead tensor now, or at the next wait if a transfer still reads/writes it."""
        if key not in self.device:
            return
        if key in self.reading or key in self.inflight:
            self.dead.add(key)
            return
        self.sent.pop(key, None)
        self._drop(key)

    def _usable(self, key: Key, what: str) -> None:
        """Check the tensor is on the device (waiting for the channel if it is arriving);
        `what` names the kind of operation needing it, e.g. "Forward"."""
        if key in self.device and key not in self.inflight:
            return
        if key in self.inflight:
            self._sync()
        if key not in self.device or key in self.inflight:
            name = self.graph.nodes[key[0]].name
            node = self.graph.nodes[getattr(self.ops[self.index], "node", key[0])].name
            raise ValueError(
                f"op {self.index} ({what} {node}): tensor {name}.{key[1]} is not on the device;"
                " recompute it (Forward) or prefetch it before this operation"
            )

    # ---- operations -----------------------------------------------------------------------
    def _forward(self, op: Forward, runs: list[int]) -> None:
        node = self.graph.nodes[op.node]
        what = "Forward"
        if node.is_input:
            raise ValueError(f"op {self.index}: {node.name} is a graph input; it has no forward")
        for i in node.inputs:
            self._usable((i, TensorPart.OUTPUT), what)
        keys = [(op.node, TensorPart.OUTPUT)]
        sizes = [node.output_bytes]
        if op.keep_saved and self.has_saved[op.node]:
            keys.append((op.node, TensorPart.SAVED))
            sizes.append(node.saved_extra_bytes)
        if self.pins.get(op.node):
            holders = [self.graph.nodes[h].name for h in self.pins[op.node]]
            raise ValueError(
                f"op {self.index} (Forward {node.name}): the output of {node.name} is held by "
                "the saved "
                f"tensors of {holders} (autograd_state); keep it instead of recomputing it"
            )
        for key in keys:
            if key in self.device:
                raise ValueError(
                    f"op {self.index} (Forward {node.name}): {node.name}.{key[1]} is still on "
                    "the device; a recomputation must come after the previous copy is dead"
                )
        self._note(self.mem + sum(sizes) + node.fwd_tmp_bytes)
        for key, size in zip(keys, sizes, strict=True):
            self._alloc(key, size)
        self.now += node.fwd_s
        self.compute += node.fwd_s
        if runs[op.node]:
            self.recompute += node.fwd_s
        runs[op.node] += 1

    def _backward(self, op: Backward, runs: list[int], done: list[bool]) -> None:
        graph, j = self.graph, op.node
        node = graph.nodes[j]
        what = "Backward"
        if node.is_input or done[j] or not runs[j]:
            reason = (
                "is a graph input"
                if node.is_input
                else "ran already"
                if done[j]
                else "has not run its forward"
            )
            raise ValueError(
                f"op {self.index} (Backward {node.name}): the node {reason}; fix the schedule"
            )
        waiting = [graph.nodes[u].name for u in self.users[j] if not done[u]]
        if waiting:
            raise ValueError(
                f"op {self.index} (Backward {node.name}): the backward of its consumers "
                f"{waiting} must run first (reverse topological order)"
            )
        for key in self.reads[j]:
            self._usable(key, what)
        new = {i: graph.nodes[i].output_bytes for i in node.inputs if i not in self.grads}
        self._note(self.mem + sum(new.values()) + node.bwd_tmp_bytes)
        self.grads.update(new)
        self.mem += sum(new.values())
        self.mem -= self.grads.pop(j)
        done[j] = True
        self.now += node.bwd_s
        self.compute += node.bwd_s

    def _transfer(self, op: Offload | Prefetch) -> None:
        key = (op.node, op.part)
        name = f"{self.graph.nodes[op.node].name}.{op.part}"
        kind = type(op).__name__
        if self.bw is None:
            raise ValueError(
                f"op {self.index}: {kind} {name} needs a transfer channel; pass pcie_bytes_per_s"
            )
        if not 0 <= op.fraction <= 1:
            raise ValueError(
                f"op {self.index}: {kind} {name} fraction={op.fraction!r} must be in [0, 1]"
            )
        size = self.graph.tensor_bytes(*key)
        if isinstance(op, Offload):
            self._usable(key, "Offload")
            done = self.sent.get(key, 0.0) + op.fraction
            if done > 1 + _TOL or (op.release and done < 1 - _TOL):
                raise ValueError(
                    f"op {self.index}: Offload {name} brings its slices to {done:.6g} of the "
                    "tensor; slices add up to 1, and release comes with the last one"
                )
            self.sent[key] = done
            self.reading.add(key)
            if op.release:
                self.releasing.add(key)
        else:
            if key not in self.host:
                raise ValueError(f"op {self.index}: cannot prefetch {name}: no host copy yet")
            if key not in self.inflight:
                if key in self.device:
                    raise ValueError(
                        f"op {self.index}: cannot prefetch {name}: it is on the device"
                    )
                self._note(self.mem + size)
                self._alloc(key, size)
                self.inflight[key] = 0.0
            self.inflight[key] += op.fraction
            if self.inflight[key] > 1 + _TOL:
                raise ValueError(f"op {self.index}: Prefetch {name} slices add up to more than 1")
        start = max(self.now, self.chan_free)
        self.chan_free = start + size * op.fraction / self.bw
        self.moved += size * op.fraction

    def _sync(self) -> None:
        """Wait for every issued transfer: finished offloads leave a host copy (and free the
        device copy if released), finished prefetches become usable."""
        if self.chan_free > self.now:
            self.stall += self.chan_free - self.now
            self.now = self.chan_free
        for key in self.reading:
            if self.sent.get(key, 0.0) >= 1 - _TOL:
                self.host.add(key)
        for key in self.releasing:
            self.sent.pop(key, None)
            if key in self.device:
                self._drop(key)
            self.dead.discard(key)
        self.reading.clear()
        self.releasing.clear()
        for key in [k for k, share in self.inflight.items() if share >= 1 - _TOL]:
            del self.inflight[key]
        for key in [k for k in self.dead if k not in self.inflight]:
            self.dead.discard(key)
            self._release(key)
