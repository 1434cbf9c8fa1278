"""One traced training step: per layer FLOPs, saved bytes, transient peaks, op graphs.

Ops are attributed to chain segments (0: embedding, 1..L: blocks, L+1: head) by module hooks:
forward pre/post hooks on the blocks, and full backward pre/post hooks for the backward pass.
A `TorchDispatchMode` sees every aten op (real, meta or fake tensors alike): it counts FLOPs
(`flops.op_flops`), follows the bytes of live tensor storages (to find transient peaks) and
records the forward op graph. `saved_tensors_hooks` sees what autograd keeps for backward;
storages are counted once, parameters never.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .flops import is_attention_op, op_flops
from .saved_copies import SavedCopies

FWD, BWD = 0, 1


@dataclass
class SegmentStats:
    """What one chain segment did in the traced step (mutable while tracing)."""

    flops: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """FLOPs in forward, backward."""
    saved_bytes: float = 0.0
    """Bytes kept for backward (deduplicated by storage)."""
    saved_tensors: int = 0
    """Tensors autograd saves for backward in the forward, parameters and repeats included:
    each passes an activation checkpoint's pack and unpack hooks."""
    replicated_bytes: float = 0.0
    """Part of `saved_bytes` a tensor-parallel rank would hold whole (norm inputs/outputs and
    residual-path dropout masks, see docs/cost-model.md)."""
    attn_core_bytes: float = 0.0
    """Part of `saved_bytes` in s x s attention scores (selective recompute drops it)."""
    norm_copy_bytes: float = 0.0
    """Part of `replicated_bytes` its norms kept beyond their inputs (`saved_copies.py`)."""
    glu_copy_bytes: float = 0.0
    """Part of `saved_bytes` that is silu(gate) kept by a gated MLP's multiply."""
    attn_core_flops: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """FLOPs of ops producing s x s scores or consuming them (QK^T, AV; fused attention), per
    phase (forward, backward)."""
    peak: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Highest live bytes seen in forward, backward."""
    start: list[float] = field(default_factory=lambda: [-1.0, -1.0])
    """Live bytes when the segment's forward/backward started."""
    end: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Live bytes when it ended."""
    input_bytes: float = 0.0
    """Bytes of the segment's input tensor."""
    output_bytes: float = 0.0
    """Bytes of the segment's output tensor."""
    params: int = 0
    """Parameters first used by this segment."""
    param_tensors: int = 0
    """Parameter tensors first used by this segment."""
    param_sizes: list[int] = field(default_factory=list)
    """Elements of each, in the order of first use."""
    ops: list[int] = field(default_factory=lambda: [0, 0])
    """Aten operators dispatched in forward, backward (views included)."""
    stream_bytes: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Bytes read and written by memory-bound operators (no FLOPs, not a view, not a
    transcendental) in forward, backward."""
    written_bytes: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Bytes of the fresh outputs of those operators and of the transcendentals, forward,
    backward (what page-faults past the allocator's mmap threshold)."""
    special: list[dict[str, float]] = field(default_factory=lambda: [{}, {}])
    """Output elements of transcendental operators by overload packet, forward, backward."""
    expert_params: int = 0
    """Of which in MoE experts."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Forward op graph (when recorded): per op its name, `inputs` and `bwd_reads` (producers:
    node index, -1 the segment's input, -2 from outside), bytes, FLOPs, `saved`."""
    output_node: int = -1
    """Node producing the segment's output (-1: its input, or not recorded)."""

    def tmp_bytes(self, phase: int) -> float:
        """Transient peak: above both what was live at its start and what persists after."""
        if self.start[phase] < 0:
            return 0.0
        return max(0.0, self.peak[phase] - max(self.start[phase], self.end[phase]))


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


SPECIAL_OPS = frozenset(
    {
        "aten.tanh",
        "aten.exp",
        "aten.erf",
        "aten.sigmoid",
        "aten.silu",
        "aten.gelu",
        "aten.gelu_backward",
        "aten.silu_backward",
        "aten._softmax",
        "aten._log_softmax",
        "aten._log_softmax_backward_data",
        "aten.sin",
        "aten.cos",
        "aten.log",
    }
)
"""Transcendental operators: a CPU computes them far below its memory bandwidth (each
element is a polynomial or table evaluation), so they are priced by measured elements per
second (`paraplan calibrate`), not by bytes streamed."""
_INDEX_OPS = frozenset({"aten.embedding"})
"""Gathers: they read the rows they write, not their whole table."""


def _dispatched(func: Any) -> bool:
    """Whether an op is one the model's own code dispatches: not a `prim` query (the meta
    device answers `.device` through the dispatcher) nor the detaches the tracer's own
    saved-tensor hooks add."""
    name = str(func._overloadpacket)
    return not (name.startswith("prim.") or name == "aten.detach")


def _count_traffic(
    seg: SegmentStats, phase: int, func: Any, args: tuple, kwargs: dict, out: Any
) -> None:
    """Add one FLOP-free operator to `seg`'s memory traffic (or transcendental elements).
    Views (outputs aliasing an input, unwritten) move no data."""
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return
    name = str(func._overloadpacket)
    outs = _tensors(out)
    out_bytes = sum(_nbytes(t) for t in outs)
    if returns and all(r.alias_info is None for r in returns):  # fresh outputs, not in place
        seg.written_bytes[phase] += out_bytes
    if name in SPECIAL_OPS:
        special = seg.special[phase]
        special[name] = special.get(name, 0.0) + sum(t.numel() for t in outs)
        return
    if name in _INDEX_OPS:
        seg.stream_bytes[phase] += 2.0 * out_bytes
        return
    seg.stream_bytes[phase] += out_bytes + sum(_nbytes(t) for t in _tensors((args, kwargs)))


class _CallBoundary(TorchFunctionMode):
    """Calls `on_call` as every top-level torch function starts: the previous call has
    returned, so what autograd saved since was its outputs, not the next call's inputs."""

    def __init__(self, on_call: Callable[[], None]) -> None:
        super().__init__()
        self.on_call = on_call

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        self.on_call()
        return func(*args, **(kwargs or {}))


class UnsupportedOpError(ValueError):
    """An op the profiler cannot run here (e.g. data-dependent shapes on the meta device)."""


class Tracer(TorchDispatchMode):
    """Attributes every op of one forward+backward to chain segments."""

    def __init__(
        self,
        model: nn.Module,
        blocks: tuple[nn.Module, ...],
        *,
        seq_len: int,
        hidden: int,
        graph_segments: set[int],
        on_segment: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        self.num_segments = len(blocks) + 2
        self.stats = [SegmentStats() for _ in range(self.num_segments)]
        self.seq_len, self.hidden = seq_len, hidden
        self.graph_segments = graph_segments
        self.on_segment = on_segment
        self.phase, self.seg = FWD, 0
        self.live = 0.0
        self._live_ids: dict[int, int] = {}
        self._producer: dict[int, tuple[int, int]] = {}  # storage id -> (segment, node index)
        self._saved_ids: set[int] = set()
        self._pending: list[int] = []  # storages saved since the last recorded op
        self._last_node: tuple[int, int] | None = None  # (segment, node) recorded last
        self._called_since_op = False  # a torch function started since the last recorded op
        self._seg_input: dict[int, int] = {}  # segment -> storage id of its input
        self._replicated_ids: set[int] = set()
        self._in_norm = 0  # depth inside normalization modules (what they save is replicated)
        self._copies = SavedCopies()  # what fused kernels would not keep
        self._params: dict[int, tuple[int, bool]] = {}  # storage id -> (numel, is_expert)
        for name, p in model.named_parameters():  # a shared expert sees every token: dense
            routed = "expert" in name and "shared_expert" not in name
            self._params[id(p.untyped_storage())] = (p.numel(), routed)
        self._param_seen: set[int] = set()
        self._handles: list[Any] = []
        self._blocks = blocks
        self._block_input_id = [-1] * len(blocks)
        self._hook_blocks(blocks)
        self._hook_norms(model)
        self.module_stack: list[str] = []
        names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}

        def push(m: nn.Module, _args: Any) -> None:
            self.module_stack.append(names.get(id(m), type(m).__name__))

        def pop(_m: nn.Module, _args: Any, _out: Any) -> None:
            if self.module_stack:
                self.module_stack.pop()

        self._handles += [
            torch.nn.modules.module.register_module_forward_pre_hook(push),
            torch.nn.modules.module.register_module_forward_hook(pop),
        ]
        self.stats[0].start[FWD] = 0.0

    def __enter__(self) -> Tracer:
        self._boundary = _CallBoundary(self._on_call)
        self._boundary.__enter__()
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._boundary.__exit__(*exc)

    # ---- segment bookkeeping -----------------------------------------------------------
    def switch(self, phase: int, seg: int) -> None:
        """Enter `seg` in `phase` (closing the current segment's accounting)."""
        self._flush_saved(set())
        cur = self.stats[self.seg]
        cur.end[self.phase] = self.live
        self.phase, self.seg = phase, seg
        new = self.stats[seg]
        if new.start[phase] < 0:
            new.start[phase] = self.live
        new.peak[phase] = max(new.peak[phase], self.live)
        if self.on_segment is not None:
            self.on_segment(phase, seg)

    def _hook_blocks(self, blocks: tuple[nn.Module, ...]) -> None:
        last = len(blocks) - 1
        for i, block in enumerate(blocks):

            def pre(_m: nn.Module, args: tuple, kwargs: dict, i: int = i) -> None:
                self.switch(FWD, i + 1)
                inputs = _tensors((args, kwargs))
                if inputs:
                    self.stats[i + 1].input_bytes = _nbytes(inputs[0])
                    self._seg_input[i + 1] = id(inputs[0].untyped_storage())
                    if i == 0:
                        self.stats[0].output_bytes = _nbytes(inputs[0])
                        self.mark_output(0, inputs[0])

            def post(_m: nn.Module, _a: tuple, _k: dict, out: Any, i: int = i) -> None:
                outs = _tensors(out)
                if outs:
                    self.stats[i + 1].output_bytes = _nbytes(outs[0])
                    self.mark_output(i + 1, outs[0])
                    if i == last:  # the head reads the last block's output
                        self.stats[last + 2].input_bytes = _nbytes(outs[0])
                        self._seg_input[last + 2] = id(outs[0].untyped_storage())
                if i == last:
                    self.switch(FWD, last + 2)

            def bwd_pre(_m: nn.Module, _g: Any, i: int = i) -> None:
                self.switch(BWD, i + 1)

            def bwd_post(_m: nn.Module, _gi: Any, _go: Any, i: int = i) -> None:
                self.switch(BWD, i)

            self._handles += [
                block.register_forward_pre_hook(pre, with_kwargs=True),
                block.register_forward_hook(post, with_kwargs=True),
                block.register_full_backward_pre_hook(bwd_pre),
                block.register_full_backward_hook(bwd_post),
            ]

    def _hook_norms(self, model: nn.Module) -> None:
        """Inputs and outputs of normalization layers are replicated across TP ranks."""

        def mark(*tensors_of: Any) -> None:
            for t in _tensors(tensors_of):
                self._replicated_ids.add(id(t.untyped_storage()))

        def enter(_m: nn.Module, args: tuple) -> None:
            mark(args)
            self._in_norm += 1
            if self.phase == FWD:
                self._copies.enter_norm(_tensors(args), self._saved_ids)

        def leave(_m: nn.Module, _a: tuple, out: Any) -> None:
            mark(out)
            self._in_norm -= 1
            if self.phase == FWD:
                self.stats[self.seg].norm_copy_bytes += self._copies.leave_norm()

        for m in model.modules():
            if "norm" in type(m).__name__.lower():
                self._handles += [
                    m.register_forward_pre_hook(enter),
                    m.register_forward_hook(leave),
                ]

    @staticmethod
    def _device_note(args: tuple) -> str:
        devices = {t.device.type for t in _tensors(args)}
        return "on " + ", ".join(sorted(devices)) if devices else "no tensor inputs"

    def remove_hooks(self) -> None:
        """Detach every hook this tracer installed."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- memory ------------------------------------------------------------------------
    def _track(self, t: torch.Tensor) -> int:
        st = t.untyped_storage()
        key = id(st)
        if key in self._live_ids or key in self._params:
            return 0
        nbytes = st.nbytes()
        self._live_ids[key] = nbytes
        self.live += nbytes
        weakref.finalize(st, self._free, key)
        return nbytes

    def _free(self, key: int) -> None:
        self.live -= self._live_ids.pop(key, 0)
        self._producer.pop(key, None)
        self._replicated_ids.discard(key)  # a later storage may take the freed one's id
        self._saved_ids.discard(key)  # (a graph discarded in forward frees what it saved)

    def mark_output(self, seg: int, t: torch.Tensor) -> None:
        """Record which node of `seg`'s graph produced `t`, the segment's output."""
        prod = self._producer.get(id(t.untyped_storage()))
        self.stats[seg].output_node = prod[1] if prod is not None and prod[0] == seg else -1

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks pack: count what autograd keeps, once per storage, and note
        which op's backward reads it (the op about to run saves its inputs, the op that just
        ran its outputs: autograd saves inputs before calling the kernel, outputs after)."""
        if self.phase != FWD:
            return t
        self.stats[self.seg].saved_tensors += 1
        st = t.untyped_storage()
        key = id(st)
        if key in self._params:
            return t
        if self.seg in self.graph_segments:
            self._pending.append(key)
        if key in self._saved_ids:
            return t
        self._saved_ids.add(key)
        nbytes = st.nbytes()
        seg = self.stats[self.seg]
        seg.saved_bytes += nbytes
        self._copies.saved(t, nbytes)
        is_mask = (
            t.dtype == torch.bool
            and t.numel() % max(1, self.hidden) == 0
            and (t.dim() >= 1 and t.shape[-1] == self.hidden)
        )
        if key in self._replicated_ids or is_mask or self._in_norm:
            seg.replicated_bytes += nbytes
        elif t.dim() >= 3 and t.shape[-1] == t.shape[-2] == self.seq_len > 1:
            seg.attn_core_bytes += nbytes
        prod = self._producer.get(key)
        if prod is not None and prod[0] == self.seg and prod[1] < len(seg.nodes):
            seg.nodes[prod[1]]["saved"] = True
        return t

    # ---- ops ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            where = self.module_stack[-1] if self.module_stack else "(top level)"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UnsupportedOpError(
                f"cannot profile op {func} in module {where!r} ({self._device_note(args)}): "
                f"{first}; profile on a real device (mode='measure'), or replace the construct"
            ) from exc
        seg = self.stats[self.seg]
        flops = op_flops(func, args, kwargs, out)
        seg.flops[self.phase] += flops
        if self.phase == FWD:
            for t in _tensors((args, kwargs)):
                key = id(t.untyped_storage())
                if key in self._params and key not in self._param_seen:
                    self._param_seen.add(key)
                    numel, expert = self._params[key]
                    seg.params += numel
                    seg.param_tensors += 1
                    seg.param_sizes.append(numel)
                    seg.expert_params += numel if expert else 0
        if flops and (
            is_attention_op(func)
            or any(
                t.dim() >= 3 and t.shape[-1] == t.shape[-2] == self.seq_len > 1
                for t in _tensors((args, out))
            )
        ):
            seg.attn_core_flops[self.phase] += flops
        if _dispatched(func):
            seg.ops[self.phase] += 1
        if self.phase == FWD:
            seg.glu_copy_bytes += self._copies.op(func, (args, kwargs), out, self._saved_ids)
        if not flops and _dispatched(func):
            _count_traffic(seg, self.phase, func, args, kwargs, out)
        new_bytes = sum(self._track(t) for t in _tensors(out))
        seg.peak[self.phase] = max(seg.peak[self.phase], self.live)
        if self.phase == FWD and self.seg in self.graph_segments:
            self._record(func, args, kwargs, out, flops, new_bytes)
        return out

    def _ref(self, key: int) -> int:
        """A storage as seen from the current segment's graph: its producer node there, -1
        for the segment's input (any non-parameter from outside for the embedding), -2 for
        parameters and other tensors from outside."""
        prod = self._producer.get(key)
        if prod is not None and prod[0] == self.seg:
            return prod[1]
        if key in self._params:
            return -2
        outside_input = self.seg == 0 or self._seg_input.get(self.seg) == key
        return -1 if outside_input else -2

    def _flush_saved(self, next_inputs: set[int]) -> list[int]:
        """Attribute the storages saved since the last recorded op X, returning those the next
        op Y (its inputs: `next_inputs`) reads in its backward. Autograd saves X's outputs
        after X ran and Y's inputs before Y runs: a torch function starting in between (see
        `_CallBoundary`) separates the two. Without one (both inside one composite call), a
        storage X produced counts as X's, whose backward runs later: the safe side."""
        reads: list[int] = []
        last = self._last_node if self._last_node and self._last_node[0] == self.seg else None
        for key in dict.fromkeys(self._pending):
            made_by_last = last is not None and self._producer.get(key) == last
            if key in next_inputs and not (made_by_last and not self._called_since_op):
                reads.append(self._ref(key))
            elif last is not None:
                node = self.stats[self.seg].nodes[last[1]]
                node["bwd_reads"] = (*node["bwd_reads"], self._ref(key))
        self._pending.clear()
        return list(dict.fromkeys(reads))

    def _on_call(self) -> None:
        self._flush_saved(set())
        self._called_since_op = True

    def _record(
        self, func: Any, args: tuple, kwargs: dict, out: Any, flops: int, new_bytes: int
    ) -> None:
        seg = self.stats[self.seg]
        keys = [id(t.untyped_storage()) for t in _tensors((args, kwargs))]
        reads = self._flush_saved(set(keys))
        inputs = [self._ref(key) for key in keys]
        index = len(seg.nodes)
        node = {"op": str(func), "inputs": tuple(inputs), "output_bytes": new_bytes}
        node |= {"fwd_flops": flops, "saved": False, "bwd_reads": tuple(reads)}
        seg.nodes.append(node)
        self._last_node = (self.seg, index)
        self._called_since_op = False
        for t in _tensors(out):
            key = id(t.untyped_storage())
            if key in self._live_ids and self._producer.get(key, (None,))[0] != self.seg:
                self._producer[key] = (self.seg, index)

    def param_leftovers(self) -> None:
        """Parameters no op touched (e.g. unused heads) belong to the embedding."""
        for key, (numel, expert) in self._params.items():
            if key not in self._param_seen:
                self._param_seen.add(key)
                self.stats[0].params += numel
                self.stats[0].expert_params += numel if expert else 0
