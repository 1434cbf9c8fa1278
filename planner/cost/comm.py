"""Communication: alpha-beta times of collectives over the link a mesh axis maps to.

Ring algorithms (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH", §4): an all-reduce of B bytes over n ranks moves 2(n-1)/n * B per rank in
2(n-1) steps; all-gather and reduce-scatter move (n-1)/n * B in n-1 steps. A group that spans
nodes runs hierarchically (intra-node reduce-scatter, inter-node all-reduce of a 1/m shard on
every GPU's own NIC, intra-node all-gather), as NCCL's tree/CollNet and Horovod's hierarchical
all-reduce do (Sergeev & Del Balso 2018).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cache
from math import ceil, lcm

from ..config import EpDispatch
from ..hardware import Accelerator
from ..strategy import MeshAxis
from .routing import Routing, remote_nodes


class CollectiveKind(StrEnum):
    """The collectives the model prices (and `paraplan calibrate` times)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


@dataclass(frozen=True, slots=True)
class AxisLink:
    """How a communication group lies on the cluster."""

    size: int
    """Ranks in the group."""
    per_node: int
    """Ranks of the group inside one node."""
    nodes: int
    """Nodes the group spans."""


def place_axes(
    sizes: dict[MeshAxis, int], order: tuple[MeshAxis, ...], gpus_per_node: int
) -> dict[MeshAxis, tuple[int, int]]:
    """(size, stride) of each axis: ranks are laid out with the last axis of `order` fastest."""
    placed: dict[MeshAxis, tuple[int, int]] = {}
    stride = 1
    for axis in reversed(order):
        placed[axis] = (sizes[axis], stride)
        stride *= sizes[axis]
    return placed


def link_of(size: int, stride: int, gpus_per_node: int) -> AxisLink:
    """Group of `size` ranks at distance `stride`: how many share a node, how many nodes."""
    if size <= 1:
        return AxisLink(1, 1, 1)
    span = size * stride
    aligned = (
        gpus_per_node % span == 0  # every group inside one node
        or (span % gpus_per_node == 0 and gpus_per_node % stride == 0)  # whole nodes
        or stride % gpus_per_node == 0  # one rank per node
    )
    if not aligned:
        return _straddling_link(size, stride, gpus_per_node)
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return AxisLink(size, per_node, ceil(size / per_node))


@cache
def _straddling_link(size: int, stride: int, gpus_per_node: int) -> AxisLink:
    """Some groups straddle a node boundary: price the worst one (most nodes spanned). The
    layout repeats every lcm(size * stride, gpus_per_node) ranks, so one period is enough."""
    period = lcm(size * stride, gpus_per_node)
    nodes = 1
    for base in range(period):
        if (base // stride) % size == 0:
            spanned = {(base + j * stride) // gpus_per_node for j in range(size)}
            nodes = max(nodes, len(spanned))
    return AxisLink(size, max(1, size // nodes), nodes)


def merge_links(a: AxisLink, b: AxisLink) -> AxisLink:
    """A group made of two axes (e.g. the data-parallel x context-parallel gradient group)."""
    size = a.size * b.size
    per_node = max(1, a.per_node * b.per_node)
    return AxisLink(size, min(size, per_node), ceil(size / max(1, per_node)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Links:
    """Where each communication group of a strategy lies: one link per mesh axis, plus the
    groups made of parts of axes."""

    pp: AxisLink
    """Pipeline neighbours."""
    dp: AxisLink
    """Data-parallel replicas (or FSDP shards)."""
    cp: AxisLink
    """Context-parallel ring."""
    tp: AxisLink
    """Tensor-parallel group."""
    ep: AxisLink
    """Expert-parallel group (the innermost part of dp; with the experts folded over TP, that
    part's TP groups too)."""
    dpcp: AxisLink
    """Gradient group of the dense parameters: dp x cp."""
    edp: AxisLink
    """Gradient group of the experts: the expert-data-parallel part of dp, x cp."""
    shard: AxisLink
    """ZeRO-3 shard group of the dense parameters: the innermost `dp_shard` of dp, x cp (equal
    to `dpcp` unless HSDP)."""
    replicate: AxisLink
    """HSDP replica group: the outer dp // dp_shard part of dp (size 1 unless HSDP)."""

    def axis(self, axis: MeshAxis) -> AxisLink:
        """The link of one mesh axis (the fields are named after the axes)."""
        link: AxisLink = getattr(self, axis.value)
        return link

    @staticmethod
    def ideal_of(size: int) -> AxisLink:
        """A group of `size` ranks inside one node."""
        return AxisLink(size, size, 1)

    def ideal(self) -> Links:
        """Every group inside one node (a lower bound on any placement's time when priced
        with `Collectives(acc, lower_bound=True)`)."""
        return Links(**{f.name: Links.ideal_of(getattr(self, f.name).size) for f in fields(self)})


def links_for(
    sizes: dict[MeshAxis, int],
    order: tuple[MeshAxis, ...],
    ep: int,
    gpus_per_node: int,
    dp_shard: int | None = None,
    *,
    folded_experts: bool = False,
) -> Links:
    """The links of a strategy's groups under its mesh order (`dp_shard`: the HSDP shard
    group over dp, None for the whole of dp). `ep` counts the data-parallel ranks the experts
    split over (`Strategy.ep_dp`); with `folded_experts` the expert-parallel group is those
    ranks' TP groups together (MoE parallel folding: Megatron-Core orders the expert grid
    tp-ep-dp, the folded group spanning the TP ranks and the innermost dp ranks)."""
    placed = place_axes(sizes, order, gpus_per_node)
    per_axis = {a: link_of(n, stride, gpus_per_node) for a, (n, stride) in placed.items()}
    dp_n, dp_stride = placed[MeshAxis.DP]
    expert_dp = link_of(dp_n // ep, dp_stride * ep, gpus_per_node)
    ep_in_dp = link_of(ep, dp_stride, gpus_per_node)  # experts split the innermost part of dp
    shard_n = dp_n if dp_shard is None else dp_shard
    shard = merge_links(link_of(shard_n, dp_stride, gpus_per_node), per_axis[MeshAxis.CP])
    replicate = link_of(dp_n // shard_n, dp_stride * shard_n, gpus_per_node)
    return Links(
        pp=per_axis[MeshAxis.PP],
        dp=per_axis[MeshAxis.DP],
        cp=per_axis[MeshAxis.CP],
        tp=per_axis[MeshAxis.TP],
        ep=merge_links(per_axis[MeshAxis.TP], ep_in_dp) if folded_experts else ep_in_dp,
        dpcp=merge_links(per_axis[MeshAxis.DP], per_axis[MeshAxis.CP]),
        edp=merge_links(expert_dp, per_axis[MeshAxis.CP]),
        shard=shard,
        replicate=replicate,
    )


BUS_EFFICIENCY_INTRA = 0.8
"""Bus bandwidth NCCL reaches over NVLink/NVSwitch as a fraction of the per-direction link
figure (busbw as nccl-tests define it, doc/PERFORMANCE.md). Assumption in line with published
nccl-tests all-reduce runs on DGX A100/H100 (230-270 of 300 and 370-400 of 450 GB/s); fitted
on the published runs' training rows within that range (`benchmarks/fit_constants.py`; 0.9
before the 2026-11-25 refit); a calibration fits its bandwidth through it."""
BUS_EFFICIENCY_INTER = 0.85
"""The same over InfiniBand/RoCE per GPU rail (assumption: protocol and proxy overheads)."""
HALF_BANDWIDTH_BYTES_INTRA = 384 * 2**10
"""Size of the message one ring step moves (S / n) at which a collective reaches half its
large-message bus bandwidth inside a node: NCCL's chunk pipeline and protocols (LL, LL128,
Simple) only fill the links with large steps. Assumption read off the shape of nccl-tests
all-reduce curves on 8 GPUs (about 1/4 of the peak at 1 MiB, ~85% at 16 MiB). Equivalently
each ring step pays `HALF_BANDWIDTH_BYTES / bw` on top of its latency: collectives over large
groups, or of small tensors, run far below the link rate."""
HALF_BANDWIDTH_BYTES_INTER = 256 * 2**10
"""The same between nodes (assumption)."""


@dataclass(frozen=True, slots=True)
class _Phase:
    """One level of a hierarchical collective."""

    ranks: int
    """Ranks taking part at this level."""
    bw_bytes_per_s: float
    """Large-message bus bandwidth per rank."""
    latency_s: float
    """Latency of one step."""
    half_bytes: float
    """Message size at half bandwidth."""
    tree: bool
    """Whether NCCL may use a (double binary) tree here: between nodes."""


class Collectives:
    """Collective times on one accelerator's links, memoized (the search asks repeatedly).

    A collective over a group that spans nodes runs in two levels (NCCL's hierarchical
    algorithms): inside each node over NVLink, then between nodes on every GPU's own NIC (one
    rail per GPU) on a 1/m shard. Each level costs its steps' latency plus the bytes it moves at
    the bus bandwidth for that message size, `bw * S / (S + S_half)`. Between nodes an
    all-reduce runs as a ring (n-1 steps each way) or as NCCL's double binary tree (about
    2 log2 n steps), whichever is faster (Sanders et al. 2009; NCCL 2.4 release notes).
    """

    def __init__(
        self,
        acc: Accelerator,
        *,
        lower_bound: bool = False,
        kind_links: Mapping[CollectiveKind, tuple[float, float]] | None = None,
        sync_skew_s: float = 0.0,
    ) -> None:
        self._acc = acc
        self._skew_s = 0.0 if lower_bound else sync_skew_s
        """Seconds each collective waits for the slower rank's host work before it
        (`Calibration.sync_skew_s`; measured on a host CPU, 0 elsewhere)."""
        self._cache: dict[tuple, float] = {}
        self._lower_bound = lower_bound
        self._kind_links = dict(kind_links or {}) if not lower_bound else {}
        """Measured (bandwidth, step latency) per kind inside a node (`paraplan calibrate`,
        `Calibration.kind_link_figures`): a backend implements each collective its own way
        (gloo's all-reduce and send/recv differ 10x in latency, its reduce-scatter runs at half
        its all-gather's bandwidth)."""
        # A lower bound for any placement: every byte on the fastest link, no latency.
        fastest = max(acc.intra_node_bw_bytes_per_s, acc.inter_node_bw_bytes_per_s)
        if lower_bound:
            self._intra = self._inter = (fastest, 0.0, 0.0)
        else:
            self._intra = (
                acc.intra_node_bw_bytes_per_s * BUS_EFFICIENCY_INTRA,
                acc.intra_node_latency_s,
                HALF_BANDWIDTH_BYTES_INTRA,
            )
            self._inter = (
                acc.inter_node_bw_bytes_per_s * BUS_EFFICIENCY_INTER,
                acc.inter_node_latency_s,
                HALF_BANDWIDTH_BYTES_INTER,
            )

    @property
    def bounds_placements(self) -> bool:
        """Whether these are a bound's collectives (no latency on the fastest link, or
        `placement.PlacementBound`), not the ones a step is priced with."""
        return self._lower_bound

    def _intra_for(self, kind: CollectiveKind) -> tuple[float, float, float]:
        """(bandwidth, latency, half-bandwidth bytes) inside a node for one kind."""
        own = self._kind_links.get(kind)
        if own is None:
            return self._intra
        return (own[0] * BUS_EFFICIENCY_INTRA, own[1], self._intra[2])

    def _phases(self, link: AxisLink, kind: CollectiveKind) -> tuple[_Phase, ...]:
        """The intra-node and inter-node levels of a group."""
        phases = []
        if link.per_node > 1:
            phases.append(_Phase(link.per_node, *self._intra_for(kind), tree=False))
        if link.nodes > 1:
            phases.append(_Phase(link.nodes, *self._inter, tree=True))
        return tuple(phases)

    @staticmethod
    def _level_s(phase: _Phase, shard: float, passes: int) -> float:
        """One level: `passes`=2 for all-reduce, 1 for all-gather / reduce-scatter, on a
        tensor of `shard` bytes (unsharded at this level)."""
        n = phase.ranks
        if shard <= 0:
            return 0.0
        ring_steps = passes * (n - 1)
        # ring: each step moves S/n at the bandwidth that step size reaches
        ring = passes * (n - 1) / n * shard / phase.bw_bytes_per_s
        ring += ring_steps * (phase.latency_s + phase.half_bytes / phase.bw_bytes_per_s)
        if not (phase.tree and passes == 2):
            return ring
        # double binary tree: the whole shard pipelined in chunks, ~2 log2 n steps deep
        depth = 2 * math.ceil(math.log2(n))
        tree = 2 * (n - 1) / n * _transfer_s(shard, phase.bw_bytes_per_s, phase.half_bytes)
        return min(ring, tree + depth * phase.latency_s)

    def _hierarchical(
        self, nbytes: float, link: AxisLink, passes: int, kind: CollectiveKind
    ) -> float:
        """`passes`=2 for all-reduce, 1 for all-gather / reduce-scatter (B = unsharded bytes)."""
        time_s = 0.0
        shard = nbytes
        for phase in self._phases(link, kind):
            time_s += self._level_s(phase, shard, passes)
            shard /= phase.ranks  # the next (inter-node) level works on a 1/m shard per GPU
        return time_s

    def all_reduce(self, nbytes: float, link: AxisLink) -> float:
        """Seconds to all-reduce `nbytes` over the group."""
        key = ("ar", nbytes, link)
        if key not in self._cache:
            self._cache[key] = (
                self._hierarchical(nbytes, link, 2, CollectiveKind.ALL_REDUCE) + self._skew_s
                if link.size > 1
                else 0.0
            )
        return self._cache[key]

    def all_gather(self, nbytes: float, link: AxisLink) -> float:
        """Seconds to all-gather a tensor of `nbytes` (unsharded size)."""
        return self._one_pass(nbytes, link, CollectiveKind.ALL_GATHER)

    def reduce_scatter(self, nbytes: float, link: AxisLink) -> float:
        """Seconds to reduce-scatter a tensor of `nbytes` (unsharded size): the all-gather's
        steps and bytes, on its own measured link when calibrated."""
        return self._one_pass(nbytes, link, CollectiveKind.REDUCE_SCATTER)

    def _one_pass(self, nbytes: float, link: AxisLink, kind: CollectiveKind) -> float:
        key = (kind, nbytes, link)
        if key not in self._cache:
            self._cache[key] = (
                self._hierarchical(nbytes, link, 1, kind) + self._skew_s if link.size > 1 else 0.0
            )
        return self._cache[key]

    def all_to_all(self, nbytes: float, link: AxisLink) -> float:
        """Seconds for each rank to exchange `nbytes` evenly with the group (pairwise: the
        share bound for other nodes leaves on the rank's own NIC)."""
        if link.size <= 1:
            return 0.0
        n, m = link.size, link.per_node
        intra_bw, intra_lat, intra_half = self._intra_for(CollectiveKind.ALL_TO_ALL)
        inter_bw, inter_lat, inter_half = self._inter
        intra_bytes = (m - 1) / n * nbytes
        inter_bytes = (n - m) / n * nbytes
        intra = _transfer_s(intra_bytes, intra_bw, intra_half)
        inter = _transfer_s(inter_bytes, inter_bw, inter_half)
        lat = inter_lat if link.nodes > 1 else intra_lat
        return intra + inter + (n - 1) * lat + self._skew_s

    def dispatch(self, token_bytes: float, routing: Routing, link: AxisLink) -> float:
        """Seconds for one MoE dispatch (or combine) over the expert-parallel group, each rank
        holding `token_bytes` of tokens (one copy each) routed as `routing` says.

        - `EpDispatch.ALL_TO_ALL`: an all-to-all of top_k copies of every token.
        - `EpDispatch.HIERARCHICAL` over several nodes (DeepEP's normal kernels): each token
          crosses the network once per other node holding any of its experts
          (`cost/routing.remote_nodes`), on the rank's own NIC, while the copies for the experts'
          GPUs within each node (all but the 1/m landing on the forwarding GPU itself) move over
          NVLink, pipelined with it: the slower of the two, one latency per peer node and per
          NVLink peer. Within one node it is the all-to-all."""
        copies = token_bytes * routing.top_k
        if routing.dispatch == EpDispatch.ALL_TO_ALL:
            return self.all_to_all(copies, link)
        if self._lower_bound:
            # a bound for any placement: the nodes the group spans decide the bytes (within one
            # node it sends the most), so no time is the safe bound
            return 0.0
        if link.nodes <= 1:
            return self.all_to_all(copies, link)
        key = ("dispatch", token_bytes, routing, link)
        if key not in self._cache:
            m = link.per_node
            intra_bw, intra_lat, intra_half = self._intra_for(CollectiveKind.ALL_TO_ALL)
            inter_bw, inter_lat, inter_half = self._inter
            rdma_bytes = token_bytes * remote_nodes(routing, link.nodes)
            nvlink_bytes = copies * (m - 1) / m
            rdma = _transfer_s(rdma_bytes, inter_bw, inter_half)
            nvlink = _transfer_s(nvlink_bytes, intra_bw, intra_half)
            lat = (link.nodes - 1) * inter_lat + (m - 1) * intra_lat
            self._cache[key] = max(rdma, nvlink) + lat + self._skew_s
        return self._cache[key]

    def p2p(self, nbytes: float, cross_node: bool) -> float:
        """Seconds to send `nbytes` to one peer."""
        bw, lat, half = self._inter if cross_node else self._intra_for(CollectiveKind.SEND_RECV)
        return lat + _transfer_s(nbytes, bw, half) + self._skew_s


def _transfer_s(nbytes: float, bw_bytes_per_s: float, half_bytes: float) -> float:
    """Seconds to move `nbytes` at `bw * S / (S + S_half)`: `(S + S_half) / bw` (0 for no
    bytes)."""
    return (nbytes + half_bytes) / bw_bytes_per_s if nbytes > 0 else 0.0
