"""The rematerialization + offload ILP's model: stages, variables, constraints (PuLP).

Checkmate's formulation (Jain et al. 2020 §4: R = computed in a stage, S = kept from the stage
before, FREE = freed after an operation, memory U tracked operation by operation), over the
training graph of an `OpGraph`: stage t < n computes forward node t of the topological order
for the first time (the frontier, §4.2) and may recompute any earlier one; stage n + u runs the
u-th backward (reverse order) after any recomputations. Extensions:
- a node's forward may keep its private saved tensor (K, Rotor's F_all) or not;
- offload and prefetch over one channel of fixed bandwidth (Beaumont et al. 2021, "Efficient
  Combination of Rematerialization and Offloading for Training DNNs", §3), issued in slices at
  the start of stages: a stage with transfers ends waiting for them, and lasts
  max(compute, bytes moved / bandwidth). Slices spread one tensor's copy over the stages it
  overlaps (a fluid channel), which keeps the model linear without big-M time constraints;
- a node's private saved tensor may hold the tensors its backward reads (`autograd_state`),
  which then cannot be recomputed while it is on the device;
- `persistent`: Rotor's space (first pass computes each node once; what enters a backward
  stage stays until its last reader), where the ILP's optimum is the chain DP's.
The variables exist only inside each tensor's lifetime window, and every memory term is exact
for the schedule a solution describes (FREE two-sided, no tensor kept past its last use), so
the model's peak is the simulator's (see `simulator`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .graph import OpGraph, TensorPart

Key = tuple[int, TensorPart]
OUT, SAV = TensorPart.OUTPUT, TensorPart.SAVED


TRANSFER_OP_COST = 1e-6
"""Objective cost of issuing one transfer operation, in units of the no-recomputation step
time: breaks ties against empty transfers; the reported makespan leaves it out."""


def _name(kind: str, t: int, key: Key) -> str:
    return f"{kind}_{t}_{key[0]}_{key[1]}"


@dataclass(kw_only=True)
class Structure:
    """Stage layout and lifetime windows of a graph (no solver involved)."""

    graph: OpGraph
    fwd: list[int] = field(default_factory=list)
    """Compute nodes in forward order; stage t < len(fwd) is fwd[t]'s frontier."""
    fstage: dict[int, int] = field(default_factory=dict)
    bstage: dict[int, int] = field(default_factory=dict)
    keys: list[Key] = field(default_factory=list)
    size: dict[Key, float] = field(default_factory=dict)
    first: dict[Key, int] = field(default_factory=dict)
    """Earliest stage a tensor exists in (-1: a graph input, present before stage 0)."""
    last: dict[Key, int] = field(default_factory=dict)
    """Last stage that can read the tensor."""
    useful: dict[int, int] = field(default_factory=dict)
    """Last stage in which computing the node can serve anything."""
    gpre: dict[int, float] = field(default_factory=dict)
    gpeak: dict[int, float] = field(default_factory=dict)

    @property
    def stages(self) -> int:
        return 2 * len(self.fwd)

    def bwd_node(self, t: int) -> int | None:
        n = len(self.fwd)
        return self.fwd[2 * n - 1 - t] if t >= n else None

    def computes(self, t: int) -> list[int]:
        """Nodes that stage t may compute, in topological order."""
        return [i for i in self.fwd if self.fstage[i] <= t <= self.useful[i]]


def structure(graph: OpGraph) -> Structure:
    st = Structure(graph=graph, fwd=list(graph.compute_nodes))
    n = len(st.fwd)
    for t, i in enumerate(st.fwd):
        st.fstage[i], st.bstage[i] = t, 2 * n - 1 - t
    users = graph.consumers()
    readers: dict[Key, list[int]] = {}
    for j in st.fwd:
        for key in graph.bwd_reads(j):
            readers.setdefault(key, []).append(st.bstage[j])
    for i in reversed(range(len(graph))):
        node = graph.nodes[i]
        out_last = max([*readers.get((i, OUT), []), *(st.useful[j] for j in users[i])], default=-1)
        first = -1 if node.is_input else st.fstage[i]
        st.keys.append((i, OUT))
        st.first[(i, OUT)], st.last[(i, OUT)] = first, max(out_last, first)
        st.size[(i, OUT)] = node.output_bytes
        if graph.has_saved(i):
            st.keys.append((i, SAV))
            st.first[(i, SAV)], st.last[(i, SAV)] = first, st.bstage[i]
            st.size[(i, SAV)] = node.saved_extra_bytes
        if not node.is_input:
            st.useful[i] = max(st.last[(i, OUT)], st.last.get((i, SAV), -1))
    alive: dict[int, float] = {}
    for u in range(n):
        t, b = n + u, st.fwd[n - 1 - u]
        st.gpre[t] = sum(alive.values())
        if u == 0:
            alive.update({i: graph.nodes[i].output_bytes for i in graph.sinks()})
        new = {i: graph.nodes[i].output_bytes for i in graph.nodes[b].inputs if i not in alive}
        st.gpeak[t] = sum(alive.values()) + sum(new.values()) + graph.nodes[b].bwd_tmp_bytes
        alive.update(new)
        alive.pop(b)
    return st


class Model:
    """The PuLP problem over a `Structure` for a budget (or, with `budget=None`, the smallest
    peak); `offload` adds the transfer channel of `bw` bytes/s."""

    def __init__(
        self, st: Structure, budget: float | None, bw: float | None, *, persistent: bool = False
    ) -> None:
        import pulp

        self.st, self.bw, self.pulp, self.persistent = st, bw, pulp, persistent
        self.users = st.graph.consumers()
        # Scale to numbers near 1 (solver tolerances are absolute): memory in units of the
        # largest tensor, time in units of the no-recomputation makespan.
        self.mem_scale = max([*st.size.values(), 1.0])
        self.time_scale = st.graph.store_all_makespan_s or 1.0
        self.prob = pulp.LpProblem("remat", pulp.LpMinimize)
        self.count = 0
        T, g = st.stages, st.graph
        self.R: dict[tuple[int, int], Any] = {}
        self.K: dict[tuple[int, int], Any] = {}
        for t in range(T):
            for i in st.computes(t):
                if persistent and t < len(st.fwd) and st.fstage[i] != t:
                    continue  # Rotor's first pass computes each node once
                self.R[t, i] = 1 if st.fstage[i] == t else self._bin(f"R_{t}_{i}")
                if g.has_saved(i) and t <= st.bstage[i]:
                    self.K[t, i] = self._bin(f"K_{t}_{i}")
                    self._add(self.K[t, i] <= self.R[t, i])
        self.S: dict[tuple[int, Key], Any] = {}
        for key in st.keys:
            lo = st.first[key] + 1
            for t in range(max(lo, 0), st.last[key] + 1):
                self.S[t, key] = 1 if (lo == 0 and t == 0) else self._bin(_name("S", t, key))
        self.Rd: dict[tuple[int, Key], Any] = {}
        self.wo: dict[tuple[int, Key], Any] = {}
        self.Dn: dict[tuple[int, Key], Any] = {}
        self.Pi: dict[tuple[int, Key], Any] = {}
        self.wi: dict[tuple[int, Key], Any] = {}
        self.Ar: dict[tuple[int, Key], Any] = {}
        if bw is not None:
            self._offload_vars()
        self._flow()
        self.U = self._memory()
        if budget is None:
            self.peak = self.prob.add_variable("peak", lowBound=0)
            for expr in self.U:
                self._add(expr <= self.peak)
            self.prob += self.peak
        else:
            for expr in self.U:
                self._add(expr <= budget / self.mem_scale)
            self.prob += self._time()

    # ---- helpers --------------------------------------------------------------------------
    def _bin(self, name: str) -> Any:
        self.count += 1
        return self.prob.add_variable(name, cat="Binary")

    def _add(self, constraint: Any) -> None:
        if not isinstance(constraint, bool):  # constant-only comparisons are checked by hand
            self.prob += constraint

    def ops(self, t: int) -> list[int]:
        """Nodes stage t may compute, in order."""
        return [i for i in self.st.computes(t) if (t, i) in self.R]

    def prod(self, t: int, key: Key) -> Any:
        """1 if stage t (re)computes the tensor."""
        return (self.R if key[1] == OUT else self.K).get((t, key[0]), 0)

    def uses(self, t: int, key: Key) -> list[Any]:
        """Terms that are 1 when stage t reads the tensor."""
        terms = []
        if key[1] == OUT:
            terms = [self.R[t, j] for j in self.users[key[0]] if (t, j) in self.R]
        b = self.st.bwd_node(t)
        if key[1] == OUT and b is not None and key in self.st.graph.bwd_reads(b):
            terms.append(1)
        if key[1] == SAV and b == key[0]:
            terms.append(1)
        if (t, key) in self.Rd:
            terms.append(self.Rd[t, key])
        return terms

    # ---- variables and constraints --------------------------------------------------------
    def offloadable(self, key: Key) -> bool:
        """Offload candidates (a pruning assumption): tensors a backward reads, living three
        stages or more, at least 1% of the largest tensor, whose round trip over the channel
        fits in the step time without recomputation (a longer one stalls the step more than
        recomputing everything once would)."""
        st = self.st
        lo, hi = max(st.first[key] + 1, 0), st.last[key]
        read = any(key in st.graph.bwd_reads(j) for j in st.fwd)
        trip_s = 2 * st.size[key] / (self.bw or float("inf"))
        return (
            read
            and hi - lo >= 2
            and st.size[key] >= 0.01 * self.mem_scale
            and trip_s <= st.graph.store_all_makespan_s
        )

    def _offload_vars(self) -> None:
        """Per candidate tensor and stage: Rd (an offload slice is issued; share wo), Dn (the
        device copy is released at the stage's end), Pi (a prefetch slice is issued, share wi;
        the device buffer exists), Ar (the prefetch completes at the stage's end). Every stage
        with a transfer ends with a wait, so its transfers finish within it. Slices of one
        transfer run in consecutive stages (any split can be, with empty slices), which removes
        symmetric solutions: the offload from the tensor's first stored stage to its release,
        the prefetch from its start to its arrival. As in vDNN (Rhu et al. 2016 §3), offloads
        happen during the forward pass and prefetches during the backward pass (a pruning
        assumption of this model)."""
        st, lpSum, Var = self.st, self.pulp.lpSum, self.prob.add_variable
        n = len(st.fwd)
        for key in filter(self.offloadable, st.keys):
            lo, hi = max(st.first[key] + 1, 0), st.last[key]
            outs = range(lo, min(hi, n))
            for t in outs:
                self.Rd[t, key] = self._bin(_name("Rd", t, key))
                self.wo[t, key] = Var(_name("wo", t, key), 0, 1)
                self.Dn[t, key] = self._bin(_name("Dn", t, key))
                self._add(self.wo[t, key] <= self.Rd[t, key])
                self._add(self.Rd[t, key] <= self.S[t, key])
                self._add(self.Dn[t, key] <= self.Rd[t, key])
                self._add(self.Dn[t, key] <= lpSum(self.wo[u, key] for u in range(lo, t + 1)))
                if t > lo:  # consecutive slices, none after the release
                    self._add(self.Rd[t, key] <= self.Rd[t - 1, key] - self.Dn[t - 1, key])
            self._add(lpSum(self.wo[t, key] for t in outs) <= 1)
            ins = range(max(lo + 1, n), hi)
            for t in ins:
                self.Pi[t, key] = self._bin(_name("Pi", t, key))
                self.wi[t, key] = Var(_name("wi", t, key), 0, 1)
                self.Ar[t, key] = self._bin(_name("Ar", t, key))
                on_host = lpSum(self.Dn.get((u, key), 0) for u in range(lo, t))
                self._add(self.wi[t, key] <= self.Pi[t, key])
                self._add(self.Pi[t, key] <= on_host)
                self._add(self.Ar[t, key] <= self.Pi[t, key])
                self._add(self.Ar[t, key] <= lpSum(self.wi[u, key] for u in ins if u <= t))
                if t > ins.start:  # from the first slice to the arrival, then nothing
                    prev, arrived = self.Pi[t - 1, key], self.Ar[t - 1, key]
                    self._add(self.Pi[t, key] >= prev - arrived)
                    self._add(self.Pi[t, key] <= 1 - lpSum(self.Ar[u, key] for u in ins if u < t))
            if ins:
                self._add(self.Pi[hi - 1, key] <= self.Ar[hi - 1, key])
            self._add(lpSum(self.wi[t, key] for t in ins) <= 1)

    def _flow(self) -> None:
        st, g, lpSum = self.st, self.st.graph, self.pulp.lpSum
        for (t, j), r in self.R.items():
            for i in dict.fromkeys(g.nodes[j].inputs):
                self._add(r <= self.R.get((t, i), 0) + self.S.get((t, (i, OUT)), 0))
        for t in range(st.stages):
            b = st.bwd_node(t)
            if b is not None:
                for key in g.bwd_reads(b):
                    self._add(self.S.get((t, key), 0) + self.prod(t, key) >= 1)
        for key in st.keys:
            lo, hi = max(st.first[key], 0), st.last[key]
            for t in range(lo, hi + 1):
                here = [self.S.get((t, key), 0), self.Pi.get((t, key), 0)]
                self._add(lpSum([self.prod(t, key), *here]) <= 1)
                nxt = self.S.get((t + 1, key), 0)
                if t < hi:
                    self._add(
                        nxt
                        <= self.S.get((t, key), 0)
                        - self.Dn.get((t, key), 0)
                        + self.prod(t, key)
                        + self.Ar.get((t, key), 0)
                    )
                if (t, key) in self.S and not isinstance(self.S[t, key], int):
                    self._add(self.S[t, key] <= lpSum([*self.uses(t, key), nxt]))
                if self.persistent and t >= len(st.fwd) and (t, key) in self.S and t < hi:
                    self._add(nxt >= self.S[t, key] - self.Dn.get((t, key), 0))
        # a private saved tensor on the device holds the tensors its backward reads
        for holder in st.fwd:
            for i in g.holds(holder):
                if g.nodes[i].is_input:
                    continue
                sav = (holder, SAV)
                for t in range(st.stages):
                    on = [d[t, sav] for d in (self.S, self.Pi) if (t, sav) in d]
                    if on and (t, i) in self.R:
                        self._add(lpSum([self.R[t, i], *on]) <= 1)

    def _free(self, t: int, k: int, key: Key, later: list[int]) -> Any:
        """FREE: 1 if the tensor goes right after op k of stage t (Checkmate eq. 5-7)."""
        present = self.prod(t, key) if key[0] == k else self.R[t, k]
        factors = [present, 1 - self.S.get((t + 1, key), 0), 1 - self.Rd.get((t, key), 0)]
        factors += [1 - self.R[t, j] for j in later]
        if all(isinstance(f, int) for f in factors):
            return int(all(factors))
        if any(isinstance(f, int) and f == 0 for f in factors):
            return 0
        free = self._bin(f"FREE_{t}_{key[0]}_{key[1]}_{k}")
        for f in factors:
            self._add(free <= f)
        self._add(free >= self.pulp.lpSum(factors) - (len(factors) - 1))
        return free

    def _memory(self) -> list[Any]:
        """Memory during every operation of every stage (plus its transient bytes)."""
        st, g, lpSum = self.st, self.st.graph, self.pulp.lpSum
        exprs = []
        users = self.users
        for t in range(st.stages):
            b = st.bwd_node(t)
            c = 1 / self.mem_scale
            held = [c * st.size[key] * v for (u, key), v in self.S.items() if u == t]
            held += [c * st.size[key] * v for (u, key), v in self.Pi.items() if u == t]
            ops = self.ops(t)
            running: list[Any] = [lpSum(held), c * st.gpre.get(t, 0.0)]
            for k in ops:
                node = g.nodes[k]
                running.append(c * node.output_bytes * self.R[t, k])
                if (t, k) in self.K:
                    running.append(c * node.saved_extra_bytes * self.K[t, k])
                exprs.append(lpSum([*running, c * node.fwd_tmp_bytes * self.R[t, k]]))
                reads_b = g.bwd_reads(b) if b is not None else ()
                for key in [*((i, OUT) for i in dict.fromkeys(node.inputs)), (k, OUT), (k, SAV)]:
                    if key not in st.size or key in reads_b:
                        continue
                    later = [j for j in users[key[0]] if j > k and (t, j) in self.R]
                    if key[1] == SAV:
                        later = []
                    free = self._free(t, k, key, later)
                    if not (isinstance(free, int) and free == 0):
                        running.append(-c * st.size[key] * free)
            if b is not None:
                exprs.append(lpSum([*running, c * (st.gpeak[t] - st.gpre[t])]))
        return exprs

    def _time(self) -> Any:
        st, lpSum = self.st, self.pulp.lpSum
        g = st.graph
        c = 1 / self.time_scale
        comp = [
            lpSum(c * g.nodes[i].fwd_s * self.R[t, i] for i in self.ops(t))
            + (c * g.nodes[b].bwd_s if (b := st.bwd_node(t)) is not None else 0.0)
            for t in range(st.stages)
        ]
        if self.bw is None:
            return lpSum(comp)
        # Each stage lasts as long as its compute or its transfers, whichever is longer.
        per_byte = c / self.bw
        self.d = [self.prob.add_variable(f"d_{t}", lowBound=0) for t in range(st.stages)]
        for t in range(st.stages):
            moved = [
                st.size[key] * per_byte * w[t, key]
                for w in (self.wo, self.wi)
                for key in st.keys
                if (t, key) in w
            ]
            self._add(self.d[t] >= comp[t])
            if moved:
                self._add(self.d[t] >= lpSum(moved))
        # A tiny cost per transfer operation keeps the solver from issuing empty ones.
        ops = lpSum([*self.Rd.values(), *self.Pi.values()])
        return lpSum(self.d) + TRANSFER_OP_COST * ops
