"""Example inputs for the solvers, built from formulas (no profiler): a GPT-2 block as an op
graph, GPT-2 small as a chain, and a VGG-16 chain (a heterogeneous CNN).

Times come from a roofline (Williams et al. 2009, "Roofline: an insightful visual performance
model"): an op takes max(FLOPs / (peak * matmul efficiency), bytes moved / memory bandwidth) on
the chosen accelerator of the planner's catalog. A backward does twice the forward's FLOPs
(Narayanan et al. 2021 §5.1) and, for memory-bound ops, is taken to move twice its bytes.
"""

from __future__ import annotations

from ..hardware import Accelerator, get_accelerator
from ..model_spec import PRESETS
from .chain import ChainLayer, LayerChain
from .from_profile import chain_from_profile
from .graph import GraphOp, OpGraph

MASK_BYTES = 1
"""A dropout mask keeps one byte per element (torch.bool)."""
STAT_BYTES = 4
"""Layer norm keeps its mean and reciprocal std in fp32 per row."""


class _Roofline:
    def __init__(self, acc: Accelerator, dtype: str) -> None:
        self.flops_s = acc.peak_flops[dtype] * acc.matmul_efficiency
        self.bw = acc.memory_bw_bytes_per_s

    def time(self, flops: float, moved_bytes: float) -> float:
        return max(flops / self.flops_s, moved_bytes / self.bw)


def gpt2_block_graph(
    *,
    batch: int = 1,
    seq: int = 1024,
    hidden: int = 768,
    heads: int = 12,
    act_bytes: int = 2,
    accelerator: str = "a100-80gb",
) -> OpGraph:
    """One GPT-2 block (Radford et al. 2019; Hugging Face `GPT2Block` with dropout and the math
    attention) as an op graph, for a micro-batch of `batch` sequences.

    Node 0 is the block input. What each backward reads is what PyTorch saves, which adds up to
    Korthikanti et al. 2022 §4.1's 34·s·b·h + 5·a·s²·b bytes (16-bit activations), plus the
    layer-norm statistics. Splitting heads and merging them are contiguous copies.
    """
    b, s, h, a, p = batch, seq, hidden, heads, act_bytes
    roof = _Roofline(get_accelerator(accelerator), "bf16" if p == 2 else "fp32")
    bsh, bass = b * s * h * p, b * a * s * s * p
    stats = 2 * b * s * STAT_BYTES
    nodes: list[GraphOp] = [GraphOp(name="x", output_bytes=bsh, is_input=True)]

    def add(
        name: str,
        inputs: tuple[int, ...],
        out: float,
        *,
        flops: float = 0.0,
        moved: float | None = None,
        reads: tuple[int, ...] = (),
        own: bool = False,
        extra: float = 0.0,
    ) -> int:
        moved = sum(nodes[i].output_bytes for i in inputs) + out if moved is None else moved
        fwd = roof.time(flops, moved)
        nodes.append(
            GraphOp(
                name=name,
                inputs=inputs,
                output_bytes=out,
                fwd_s=fwd,
                bwd_s=2 * fwd,
                bwd_inputs=reads,
                bwd_output=own,
                saved_extra_bytes=extra,
            )
        )
        return len(nodes) - 1

    ln1 = add("ln1", (0,), bsh, reads=(0,), extra=stats)
    qkv = add("qkv", (ln1,), 3 * bsh, flops=2 * b * s * h * 3 * h, reads=(ln1,))
    heads_ = add("split_heads", (qkv,), 3 * bsh)
    scores = add("qk", (heads_,), bass, flops=2 * b * s * s * h, reads=(heads_,))
    probs = add("softmax", (scores,), bass, own=True)
    drop = add("attn_dropout", (probs,), bass, extra=b * a * s * s * MASK_BYTES)
    ctx = add("av", (drop, heads_), bsh, flops=2 * b * s * s * h, reads=(drop, heads_))
    merged = add("merge_heads", (ctx,), bsh)
    proj = add("proj", (merged,), bsh, flops=2 * b * s * h * h, reads=(merged,))
    rdrop = add("resid_dropout", (proj,), bsh, extra=b * s * h * MASK_BYTES)
    add1 = add("add1", (0, rdrop), bsh)
    ln2 = add("ln2", (add1,), bsh, reads=(add1,), extra=stats)
    fc1 = add("fc1", (ln2,), 4 * bsh, flops=2 * b * s * h * 4 * h, reads=(ln2,))
    gelu = add("gelu", (fc1,), 4 * bsh, reads=(fc1,))
    fc2 = add("fc2", (gelu,), bsh, flops=2 * b * s * 4 * h * h, reads=(gelu,))
    mdrop = add("mlp_dropout", (fc2,), bsh, extra=b * s * h * MASK_BYTES)
    add("add2", (add1, mdrop), bsh)
    return OpGraph(nodes=tuple(nodes), name=f"gpt2 block (b={b}, s={s}, h={h}, a={a})")


def gpt2_layer_chain(
    *, micro_batch_size: int = 1, seq: int = 1024, accelerator: str = "a100-80gb"
) -> LayerChain:
    """GPT-2 small (embedding, 12 blocks, head) from the planner's preset, timed at the
    accelerator's bf16 peak times its matmul efficiency."""
    acc = get_accelerator(accelerator)
    profile = PRESETS["gpt2"].to_profile(seq)
    return chain_from_profile(
        profile,
        micro_batch_size=micro_batch_size,
        seconds_per_flop=1 / (acc.peak_flops["bf16"] * acc.matmul_efficiency),
    )


VGG16_CONFIG: tuple[int | str, ...] = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)
"""Simonyan & Zisserman 2015, "Very Deep Convolutional Networks", Table 1, configuration D."""


def vgg16_chain(
    *, batch: int = 32, image: int = 224, act_bytes: int = 2, accelerator: str = "a100-80gb"
) -> LayerChain:
    """VGG-16 as a heterogeneous chain: conv+ReLU layers (the conv keeps its input, the ReLU its
    output), max-pools (keep their input), then three linear layers, the last one with the
    loss (output: a 4-byte scalar). Early layers hold large activations and cost little per
    byte; late ones the reverse."""
    roof = _Roofline(get_accelerator(accelerator), "bf16" if act_bytes == 2 else "fp32")
    c, hw, p = 3, image, act_bytes
    layers: list[ChainLayer] = []
    in_bytes: float = batch * c * hw * hw * p
    for i, item in enumerate(VGG16_CONFIG):
        out: float
        if item == "M":
            hw //= 2
            out = batch * c * hw * hw * p
            fwd = roof.time(0.0, in_bytes + out)
            layers.append(
                ChainLayer(
                    name=f"pool{i}",
                    fwd_s=fwd,
                    bwd_s=2 * fwd,
                    input_bytes=in_bytes,
                    saved_bytes=in_bytes,
                    output_bytes=out,
                )
            )
        else:
            cout = int(item)
            out = batch * cout * hw * hw * p
            flops = 2 * batch * hw * hw * c * cout * 9
            fwd = roof.time(flops, in_bytes + out + 9 * c * cout * p)
            layers.append(
                ChainLayer(
                    name=f"conv{i}",
                    fwd_s=fwd,
                    bwd_s=2 * fwd,
                    input_bytes=in_bytes,
                    saved_bytes=in_bytes + out,
                    output_bytes=out,
                )
            )
            c = cout
        in_bytes = out
    dims = [c * hw * hw, 4096, 4096, 1000]
    for j in range(3):
        last = j == 2
        out = 4.0 if last else batch * dims[j + 1] * p
        flops = 2 * batch * dims[j] * dims[j + 1]
        fwd = roof.time(flops, in_bytes + batch * dims[j + 1] * p + dims[j] * dims[j + 1] * p)
        saved = in_bytes + (batch * dims[j + 1] * 4 if last else batch * dims[j + 1] * p)
        layers.append(
            ChainLayer(
                name=f"fc{j}" + ("+loss" if last else ""),
                fwd_s=fwd,
                bwd_s=2 * fwd,
                input_bytes=in_bytes,
                saved_bytes=saved,
                output_bytes=out,
            )
        )
        in_bytes = out
    return LayerChain(layers=tuple(layers), name=f"vgg16 (batch {batch}, {image}x{image})")
