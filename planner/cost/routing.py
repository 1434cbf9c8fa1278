"""Where a MoE layer's tokens go: how many other nodes a token's experts sit on, which is what a
node-deduplicated dispatch (`EpDispatch.HIERARCHICAL`) sends over the network.

Experts are laid out in order over the expert-parallel ranks (Megatron-Core's and torchtitan's
expert placement: rank r holds experts [r E/ep, (r+1) E/ep)), so a node of the EP group holds
E/N consecutive experts. Routing is taken as uniform: each token picks its top-k experts as a
uniformly random k-subset (what load-balanced training approaches, and what the published
benchmarks force, Megatron-Core's `moe_router_force_load_balancing`). Under group-limited
routing (DeepSeek-V2/V3's device- and node-limited routing, arXiv 2405.04434 §2.1.2 and
2412.19437 §2.1.2: Hugging Face's `n_group` and `topk_group`, Megatron-Core's
`moe_router_num_groups` and `moe_router_group_topk`) the experts are split into G consecutive
groups, a token first picks `group_top_k` of them, then its k experts among those groups' alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..config import EpDispatch, TrainConfig
from ..model import ModelProfile


@dataclass(frozen=True, slots=True)
class Routing:
    """A MoE layer's routing and how its tokens are dispatched (`Collectives.dispatch`)."""

    experts: int
    """Routed experts per layer."""
    top_k: int
    """Experts per token."""
    dispatch: EpDispatch = EpDispatch.ALL_TO_ALL
    """How tokens travel to their experts' ranks."""
    groups: int = 1
    """Expert groups of group-limited routing (1: not limited)."""
    group_top_k: int = 1
    """Groups a token may route to (under `groups` > 1)."""

    @property
    def group_limited(self) -> bool:
        """Whether the routing picks among fewer groups than there are (and the groups split
        the experts evenly; otherwise it is priced as unlimited, which can only send more)."""
        return (
            1 <= self.group_top_k < self.groups
            and self.experts % self.groups == 0
            and self.top_k <= self.group_top_k * (self.experts // self.groups)
        )


def routing_of(profile: ModelProfile, train: TrainConfig) -> Routing:
    """The profiled model's routing under the run's dispatcher."""
    return Routing(
        experts=profile.experts,
        top_k=max(1, profile.top_k),
        dispatch=train.runtime.ep_dispatch,
        groups=profile.routing_groups,
        group_top_k=profile.routing_group_top_k,
    )


def remote_nodes(routing: Routing, nodes: int) -> float:
    """Expected number of nodes other than its own that hold at least one of a token's experts,
    when the expert-parallel group spans `nodes` nodes evenly (each holding E/N consecutive
    experts). Exact under uniform routing (module docstring): node j is hit unless none of the
    token's experts lie in its range; routing does not depend on the token's own node, which is
    any of the N alike, so the expected count of other nodes is (N - 1)/N of all nodes hit."""
    if nodes <= 1:
        return 0.0
    if routing.experts % nodes:
        raise ValueError(f"{routing.experts} experts do not split evenly over {nodes} nodes")
    hit = sum(1.0 - _p_missed(routing, nodes, j) for j in range(nodes))
    return hit * (nodes - 1) / nodes


def _p_missed(routing: Routing, nodes: int, node: int) -> float:
    """Probability that none of a token's experts lie on `node`."""
    e, k = routing.experts, routing.top_k
    per_node = e // nodes
    if not routing.group_limited:
        return _none_of(e, per_node, k)
    g, kg = routing.groups, routing.group_top_k
    per_group = e // g
    lo, hi = node * per_node, (node + 1) * per_node
    overlap = [  # the node's experts in each group that reaches it
        min(hi, (i + 1) * per_group) - max(lo, i * per_group)
        for i in range(lo // per_group, (hi - 1) // per_group + 1)
    ]
    # ways[u][x]: subsets of those groups with u groups and x of the node's experts
    ways = [[0] * (per_node + 1) for _ in range(len(overlap) + 1)]
    ways[0][0] = 1
    for o in overlap:
        for u in range(len(overlap) - 1, -1, -1):
            for x in range(per_node - o, -1, -1):
                if ways[u][x]:
                    ways[u + 1][x + o] += ways[u][x]
    chosen = kg * per_group  # experts among the chosen groups
    others = g - len(overlap)
    total = 0.0
    for u, row in enumerate(ways):
        if u > kg or kg - u > others:
            continue
        p_groups = math.comb(others, kg - u) / math.comb(g, kg)  # for each such subset
        for x, count in enumerate(row):
            if count:
                total += count * p_groups * _none_of(chosen, x, k)
    return total


@lru_cache(maxsize=4096)
def _none_of(pool: int, marked: int, k: int) -> float:
    """Probability that a uniform k-subset of `pool` items holds none of `marked` of them."""
    return math.comb(pool - marked, k) / math.comb(pool, k) if k <= pool else 0.0
