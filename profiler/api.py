"""`profile(model, example_inputs)`: a real `nn.Module` into the planner's `ModelProfile`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import nn

from paraplan.planner.model import (
    LayerCost,
    LayerGraph,
    LayerKind,
    ModelProfile,
    OpElements,
    ProfiledOp,
)

from .attention import FusedAttention
from .autocast_trace import autocast_saved_bytes
from .chain import BlockList, find_blocks, module_digest, same_structure
from .flops import windowed
from .moe import balanced_experts
from .shape import Shape, shape_of
from .swap import swapped_tensors
from .timing import measure_times
from .tracer import BWD, FWD, SegmentStats, Tracer

Mode = Literal["measure", "meta"]
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 5


def _default_loss(out: Any) -> torch.Tensor:
    """The model's own loss (Hugging Face `.loss`), else the sum of a tensor output."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0].float().sum()
    raise ValueError(
        f"cannot derive a loss from a {type(out).__name__} output; pass loss_fn=... returning "
        "a scalar tensor"
    )


def _call(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def _batch_and_seq(inputs: Any, shape: Shape | None) -> tuple[int, int]:
    first = (
        next(iter(inputs.values()))
        if isinstance(inputs, dict)
        else (inputs[0] if isinstance(inputs, tuple | list) else inputs)
    )
    if not isinstance(first, torch.Tensor) or first.dim() < 1:
        raise ValueError("example_inputs must start with a batched tensor (batch first)")
    seq = int(first.shape[1]) if shape is not None and first.dim() >= 2 else 1
    return int(first.shape[0]), seq


def traced_count(blocks: tuple[nn.Module, ...]) -> int:
    """How many leading blocks a meta trace needs: up to the first block of the final run of
    identical blocks (`same_structure`), the rest repeating it (`_assemble`). Every block but
    the first alike (GPT, Llama): 2, the first standing after the embedding; a few dense blocks
    before the MoE ones (DeepSeek-V3's first 3 of 61): those and one MoE block; no final run
    (blocks alternating, as Llama 4's dense and MoE): all."""
    n = len(blocks)
    for rep in range(1, n - 1):
        if all(same_structure(blocks[rep], b) for b in blocks[rep + 1 :]):
            return rep + 1
    return n


@contextlib.contextmanager
def _shrunk(model: nn.Module, blocks: BlockList, keep: int) -> Iterator[tuple[nn.Module, ...]]:
    """Temporarily keep only the first `keep` blocks (identical blocks cost the same)."""
    parent_name, _, attr = blocks.container.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    original = getattr(parent, attr) if attr else None
    if original is None or len(blocks.modules) <= keep:
        yield blocks.modules
        return
    kept = type(original)(list(blocks.modules[:keep]))
    setattr(parent, attr, kept)
    cfg = getattr(model, "config", None)
    old_layers = getattr(cfg, "num_hidden_layers", None)
    try:
        if old_layers is not None:
            cfg.num_hidden_layers = keep  # type: ignore[union-attr]
        yield blocks.modules[:keep]
    finally:
        setattr(parent, attr, original)
        if old_layers is not None:
            cfg.num_hidden_layers = old_layers  # type: ignore[union-attr]


@contextlib.contextmanager
def _faked(model: nn.Module, inputs: Any) -> Iterator[Any]:
    """Run a meta-device model under FakeTensorMode: parameters, buffers and inputs become fake
    tensors (restored afterwards). Libraries skip value-dependent checks (`.item()`) for fake
    tensors, which plain meta tensors cannot answer."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    fm = FakeTensorMode(allow_non_fake_inputs=True)
    fake_inputs = tree_map(
        lambda t: fm.from_tensor(t) if isinstance(t, torch.Tensor) else t, inputs
    )
    with swapped_tensors(model, fm.from_tensor), fm:
        yield fake_inputs


def profile(
    model: nn.Module,
    example_inputs: Any,
    *,
    mode: Mode = "measure",
    device: str | torch.device | None = None,
    blocks: str | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    name: str | None = None,
    measured_on: str | None = None,
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    progress: bool = False,
) -> ModelProfile:
    """Profile one training step of `model` on `example_inputs` (a tensor, tuple or kwargs
    dict, batch first) into a chain of layers: embedding, the repeated blocks (found
    automatically or named by `blocks`), head (the loss included).

    mode="measure" also times each layer's forward and backward (median of `repeats` steps
    after `warmup`; repeats=0 skips timing) on the model's device; mode="meta" expects a model
    and inputs on the meta device, traces the blocks up to the first of their final run of
    identical blocks (`traced_count`: two of a uniform model's), and leaves
    times to the roofline."""
    if mode not in ("measure", "meta"):
        raise ValueError(f"mode={mode!r} must be 'measure' or 'meta'")
    dev = torch.device(device) if device is not None else _device_of(model)
    if mode == "meta" and dev.type != "meta":
        raise ValueError(
            f"mode='meta' needs the model on the meta device, it is on {dev}; "
            "build it under `with torch.device('meta'):`"
        )
    if mode == "measure" and dev.type == "meta":
        raise ValueError("mode='measure' cannot time a meta model; use mode='meta'")
    config = getattr(model, "config", None)
    shape = shape_of(config) if config is not None and hasattr(config, "vocab_size") else None
    batch, seq = _batch_and_seq(example_inputs, shape)
    found = find_blocks(model, blocks)
    digest = module_digest(model)
    loss_of = loss_fn or _default_loss
    keep = traced_count(found.modules) if mode == "meta" else len(found.modules)
    bar = _progress(progress, 2 * (keep + 2) + (warmup + repeats if mode == "measure" else 0))
    model.train()
    faked = (
        _faked(model, example_inputs) if mode == "meta" else contextlib.nullcontext(example_inputs)
    )
    fused = (
        FusedAttention(causal="CausalLM" in type(model).__name__, model=model)
        if mode == "meta"
        else (contextlib.nullcontext())
    )
    original_inputs = example_inputs
    with (
        _shrunk(model, found, keep) as traced_blocks,
        fused,
        balanced_experts(model),  # MoE experts counted (and timed) as balanced routing
    ):
        autocast = _autocast_pass(model, traced_blocks, original_inputs, loss_of)
        with faked as example_inputs:
            hidden = shape.hidden if shape else 0
            tracer = Tracer(
                model,
                traced_blocks,
                seq_len=seq,
                hidden=hidden,
                graph_segments=set(range(len(traced_blocks) + 2)),
                on_segment=lambda *_: bar.update(1) if bar else None,
            )
            try:
                with torch.autograd.graph.saved_tensors_hooks(tracer.pack, lambda t: t), tracer:
                    loss = loss_of(_call(model, example_inputs))
                    tracer.mark_output(len(traced_blocks) + 1, loss)
                    tracer.switch(BWD, len(traced_blocks) + 1)
                    loss.backward()
                    tracer.stats[tracer.seg].end[tracer.phase] = tracer.live
            finally:
                tracer.remove_hooks()
            tracer.param_leftovers()
            model.zero_grad(set_to_none=True)
            times = None
            if mode == "measure" and repeats > 0:

                def step(mark: Callable[[int, int], None]) -> None:
                    mark(FWD, 0)
                    out_loss = loss_of(_call(model, example_inputs))
                    mark(BWD, len(traced_blocks) + 1)
                    out_loss.backward()
                    mark(BWD, 0)
                    model.zero_grad(set_to_none=True)

                times = measure_times(
                    model,
                    traced_blocks,
                    step,
                    device=dev,
                    warmup=warmup,
                    repeats=repeats,
                    tick=(lambda: bar.update(1)) if bar else None,
                )
    if bar is not None:
        bar.close()
    return _assemble(
        name or type(model).__name__,
        tracer.stats,
        autocast,
        times,
        len(found.modules),
        batch,
        seq,
        shape,
        _act_bytes(model),
        measured_on if measured_on is not None else ("" if times is None else dev.type),
        digest,
    )


def _autocast_pass(
    model: nn.Module,
    blocks: tuple[nn.Module, ...],
    inputs: Any,
    loss_of: Callable[[Any], torch.Tensor],
) -> list[float] | None:
    """`autocast_trace.autocast_saved_bytes` of the traced chain; None where a construct of
    the model does not run on fake CPU tensors (the planner then prices autocast's memory by
    its rule for pre-norm blocks, `mixed_precision.autocast_layer_bytes`)."""
    try:
        return autocast_saved_bytes(model, blocks, inputs, lambda m, x: loss_of(_call(m, x)))
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError):
        return None


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _act_bytes(model: nn.Module) -> int:
    for p in model.parameters():
        return p.element_size()
    return 4


def _progress(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="profiling", unit="segment", leave=False)


def _layer(
    kind: LayerKind,
    name: str,
    st: SegmentStats,
    times: list[list[float]] | None,
    seg: int,
    batch: int,
    autocast: list[float] | None,
) -> LayerCost:
    b = float(batch)
    rep = st.replicated_bytes / b
    return LayerCost(
        name=name,
        kind=kind,
        params=st.params - st.expert_params,
        expert_params=st.expert_params,
        fwd_flops=st.flops[FWD] / b,
        bwd_flops=st.flops[BWD] / b,
        attn_core_fwd_flops=st.attn_core_flops[FWD] / b,
        act_tp_bytes=st.saved_bytes / b - rep,
        act_replicated_bytes=rep,
        act_attn_core_bytes=st.attn_core_bytes / b,
        act_norm_copy_bytes=st.norm_copy_bytes / b,
        act_glu_copy_bytes=st.glu_copy_bytes / b,
        input_bytes=st.input_bytes / b,
        output_bytes=st.output_bytes / b,
        fwd_tmp_bytes=st.tmp_bytes(FWD) / b,
        # the embedding's backward transients are its tables' dense gradients: weight-sized,
        # whatever the traced batch (kept whole: `LayerCost.bwd_tmp_bytes`)
        bwd_tmp_bytes=st.tmp_bytes(BWD) / (1.0 if kind == LayerKind.EMBEDDING else b),
        fwd_time_s=None if times is None else times[FWD][seg] / b,
        bwd_time_s=None if times is None else times[BWD][seg] / b,
        fwd_ops=st.ops[FWD],
        bwd_ops=st.ops[BWD],
        fwd_stream_bytes=st.stream_bytes[FWD] / b,
        bwd_stream_bytes=st.stream_bytes[BWD] / b,
        fwd_written_bytes=st.written_bytes[FWD] / b,
        bwd_written_bytes=st.written_bytes[BWD] / b,
        fwd_special=_special(st.special[FWD], b),
        bwd_special=_special(st.special[BWD], b),
        param_tensors=st.param_tensors,
        param_tensor_sizes=tuple(st.param_sizes),
        saved_tensors=st.saved_tensors,
        autocast_saved_bytes=None if autocast is None else autocast[seg] / b,
    )


def _special(elems: dict[str, float], batch: float) -> tuple[OpElements, ...]:
    """Transcendental elements per sequence, by operator (sorted: profiles compare equal)."""
    return tuple(OpElements(op=op, elems=n / batch) for op, n in sorted(elems.items()))


def _graph(layer: int, st: SegmentStats, batch: int) -> LayerGraph:
    nodes = tuple(
        ProfiledOp(
            op=n["op"],
            inputs=n["inputs"],
            output_bytes=n["output_bytes"] / batch,
            fwd_flops=n["fwd_flops"] / batch,
            saved=n["saved"],
            bwd_reads=n["bwd_reads"],
        )
        for n in st.nodes
    )
    return LayerGraph(layer=layer, nodes=nodes, output=st.output_node)


def _assemble(
    name: str,
    stats: list[SegmentStats],
    autocast: list[float] | None,
    times: list[list[float]] | None,
    num_blocks: int,
    batch: int,
    seq: int,
    shape: Shape | None,
    act_bytes: int,
    measured_on: str,
    digest: str,
) -> ModelProfile:
    traced = len(stats) - 2
    layers = [_layer(LayerKind.EMBEDDING, "embedding", stats[0], times, 0, batch, autocast)]
    graphs = [_graph(0, stats[0], batch)]
    windows = shape.windows if shape else ()
    for i in range(num_blocks):
        seg = min(i, traced - 1) + 1  # blocks past the traced ones repeat the last traced
        block = _layer(LayerKind.BLOCK, f"block.{i}", stats[seg], times, seg, batch, autocast)
        window = windows[i] if i < len(windows) else 0
        layers.append(windowed(block, seq, window, stats[seg].attn_core_flops[BWD] / batch))
        if i < traced:
            graphs.append(_graph(i + 1, stats[seg], batch))
    layers.append(_layer(LayerKind.HEAD, "head", stats[-1], times, traced + 1, batch, autocast))
    graphs.append(_graph(num_blocks + 1, stats[-1], batch))
    hidden = (
        shape.hidden
        if shape
        else int(max((x.output_bytes for x in layers[1:-1]), default=0) // max(1, act_bytes))
    )
    return ModelProfile(
        name=name,
        layers=tuple(layers),
        seq_len=seq,
        act_dtype_bytes=act_bytes,
        hidden=max(1, hidden),
        heads=shape.heads if shape else 1,
        kv_heads=shape.kv_heads if shape else 1,
        ffn=shape.ffn if shape else 1,
        vocab=shape.vocab if shape else 1,
        experts=shape.experts if shape else 0,
        top_k=shape.top_k if shape else 0,
        tied_embeddings=shape.tied if shape else False,
        head_dim=shape.head_dim if shape else 0,
        dense_ffn=shape.dense_ffn if shape else 0,
        shared_expert_ffn=shape.shared_expert_ffn if shape else 0,
        latent_attention=shape.latent if shape else None,
        routing_groups=shape.routing_groups if shape else 1,
        routing_group_top_k=shape.routing_group_top_k if shape else 1,
        mtp_modules=shape.mtp_modules if shape else 0,
        measured_on=measured_on,
        module_digest=digest,
        op_graphs=tuple(graphs),
    )
