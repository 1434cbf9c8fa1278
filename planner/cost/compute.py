"""Compute time of a transformer layer from the shapes of its kernels.

A layer's matmuls run as tiled GEMMs: each thread block computes one `tile_m x tile_n` tile of
the output over the whole K dimension, and the device runs `sm_count` tiles at once (one
"wave"). Two quantization effects follow (NVIDIA, "Matrix Multiplication Background User's
Guide", DU-09799-001, 2023, §3.1 tile quantization, §3.2 wave quantization): a dimension that
is not a multiple of the tile pads it, and a tile count that is not a multiple of the SM count
leaves SMs idle in the last wave. Each tile also pays a fixed prologue/epilogue (loading the
first K slices, writing the output), worth `k_overhead` of K, which is what makes thin GEMMs
(small K, as with high tensor parallelism) slow. cuBLAS picks the tile per shape (§2.3: larger
tiles reuse data better; smaller ones fill the SMs): the model takes the fastest of a few
tiles, the smaller ones at a lower rate. A GEMM is also bounded by streaming its operands once
(the roofline, Williams et al. 2009).

Attention runs as a fused flash kernel (Dao et al. 2022; Dao 2023, FlashAttention-2): with a
causal mask it computes about half of the dense score matrix, and its backward does 2.5x the
forward's matmul work (it recomputes the scores: 5 matmuls against 2). Its rate is a fraction
of the GEMM rate (`attention_efficiency`).

The backward of a GEMM (M, N, K) is two GEMMs: the input gradient (M, K, N) and the weight
gradient (K, N, M).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Protocol

from ..hardware import Accelerator
from ..model import LayerCost, LayerKind, ModelProfile

ATTENTION_BACKWARD_FACTOR = 2.5
"""Flash-attention backward matmul work over forward (5 matmuls against 2; Dao 2023 §3.1)."""
GEMM_SCALE = 0.9
"""Global multiplier on every device's `gemm_efficiency`: one of the handful of constants
fitted on the training rows of the published runs (`benchmarks/fit_constants.py`,
docs/validation.md): whole training steps run their GEMMs below the cuBLAS
microbenchmark rate (clock throttling, L2 pollution by neighbouring kernels)."""
ATTENTION_SCALE = 0.8
"""Global multiplier on every device's `attention_efficiency` (fitted likewise; 0.85 before the
2026-11-25 refit)."""
MEMORY_EFFICIENCY = 0.8
"""Fraction of the HBM bandwidth memory-bound kernels (norms, activations, softmax) stream at
(copy-like kernels reach 80-90% of the datasheet bandwidth, the elementwise kernels of a
training step less; fitted likewise: 0.8, 0.7 before the 2026-11-25 refit)."""
CAUSAL_FRACTION = 0.5
"""Share of the score matrix a causal flash kernel computes (it skips blocks above the
diagonal; Dao 2023 §3.1.1): asymptotically one half."""


@dataclass(frozen=True, slots=True)
class Tile:
    """One GEMM tile shape cuBLAS may pick, and its rate relative to the largest."""

    m: int
    """Rows of the output tile."""
    n: int
    """Columns of the output tile."""
    rate: float
    """Per-SM throughput relative to the largest tile (less reuse of loaded operands)."""


_TILES_AMPERE_HOPPER = (
    Tile(256, 128, 1.0),
    Tile(128, 128, 0.92),
    Tile(128, 64, 0.80),
    Tile(64, 64, 0.60),
)
"""cuBLAS's typical tiles (User's Guide §2.3 lists 256x128, 128x256, 128x128, 256x64, 64x256,
128x64, 64x128, 64x64 and shows larger tiles more efficient); the relative rates are an
assumption in the order of the guide's Figure 4."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelTable:
    """How one device runs the kernels of a transformer step."""

    sm_count: int
    """Streaming multiprocessors (compute units): tiles run at once."""
    gemm_efficiency: float
    """Fraction of the dense peak a large, well-shaped GEMM reaches (cuBLAS)."""
    k_overhead: float
    """K-equivalent of a tile's fixed prologue and epilogue."""
    attention_efficiency: float
    """Rate of torch SDPA's flash kernel (FlashAttention-2) as a fraction of the dense peak."""
    fused_attention_efficiency: float
    """Rate of Transformer Engine's / cuDNN's fused attention, as Megatron runs it."""
    tiles: tuple[Tile, ...] = _TILES_AMPERE_HOPPER
    """Tiles the GEMM library picks from."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each figure comes from."""


_WHITEPAPER_A100 = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs (SXM4)"
_WHITEPAPER_H100 = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs (SXM5)"
_K_OVERHEAD = (
    "assumption: a tile's prologue/epilogue costs about 128 of K (a few pipelined K slices of "
    "64); fitted only in its order, it makes K=1024 GEMMs ~11% slower than K=8192 ones"
)
_FA2 = (
    "Dao 2023, FlashAttention-2 (arXiv:2307.08691), abstract: 50-73% of the theoretical "
    "maximum FLOP/s on A100; we take 0.60 over forward and backward"
)
_FA_HOPPER = (
    "Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608), §1: FlashAttention-2 reaches only "
    "35% of H100 peak (torch SDPA's flash backend is FlashAttention-2)"
)
_CUDNN_HOPPER = (
    "Shah et al. 2024, FlashAttention-3, Fig. 5-6: cuDNN's Hopper attention runs between "
    "FlashAttention-2 (35%) and FlashAttention-3 (up to 75%) at head dim 128: 0.55 (read off)"
)
_CUDNN_AMPERE = "assumption: on Ampere cuDNN/TE fused attention runs at FlashAttention-2's rate"
_GEMM_A100 = (
    "assumption: cuBLAS bf16 reaches ~85% of A100 dense peak on large GEMMs (the Matrix "
    "Multiplication Background User's Guide, Fig. 2, shows cuBLAS 11 near peak on large "
    "square GEMMs); refined by `paraplan calibrate`"
)
_GEMM_HOPPER = (
    "assumption: cuBLAS bf16 reaches ~75% of H100 SXM dense peak on large GEMMs (clocks drop "
    "under sustained tensor-core load); refined by `paraplan calibrate`"
)


def _table(
    sms: int,
    sm_src: str,
    gemm: float,
    gemm_src: str,
    attn: float,
    attn_src: str,
    fused: tuple[float, str] | None = None,
) -> KernelTable:
    fused_eff, fused_src = fused if fused is not None else (attn, "assumption: as SDPA's")
    return KernelTable(
        sm_count=sms,
        gemm_efficiency=gemm,
        k_overhead=128.0,
        attention_efficiency=attn,
        fused_attention_efficiency=fused_eff,
        sources={
            "sm_count": sm_src,
            "gemm_efficiency": gemm_src,
            "k_overhead": _K_OVERHEAD,
            "attention_efficiency": attn_src,
            "fused_attention_efficiency": fused_src,
        },
    )


KERNELS: dict[str, KernelTable] = {
    "a100-40gb": _table(108, _WHITEPAPER_A100, 0.85, _GEMM_A100, 0.60, _FA2, (0.60, _CUDNN_AMPERE)),
    "a100-80gb": _table(108, _WHITEPAPER_A100, 0.85, _GEMM_A100, 0.60, _FA2, (0.60, _CUDNN_AMPERE)),
    "h100": _table(
        132, _WHITEPAPER_H100, 0.75, _GEMM_HOPPER, 0.35, _FA_HOPPER, (0.55, _CUDNN_HOPPER)
    ),
    "h100-hbm2e": _table(
        132, _WHITEPAPER_H100, 0.75, _GEMM_HOPPER, 0.35, _FA_HOPPER, (0.55, _CUDNN_HOPPER)
    ),
    "h200": _table(
        132,
        _WHITEPAPER_H100 + "; H200 is the same GH100 die",
        0.75,
        _GEMM_HOPPER,
        0.35,
        _FA_HOPPER,
        (0.55, _CUDNN_HOPPER),
    ),
    "h100-pcie": _table(
        114,
        "NVIDIA H100 whitepaper: 114 SMs (PCIe)",
        0.75,
        _GEMM_HOPPER,
        0.35,
        _FA_HOPPER,
        (0.55, _CUDNN_HOPPER),
    ),
    "b200": _table(
        148,
        "NVIDIA Blackwell architecture technical brief: 148 SMs (2 dies)",
        0.70,
        "assumption: young stack, below Hopper",
        0.50,
        "assumption, as Hopper",
    ),
    "gb200": _table(
        148,
        "NVIDIA Blackwell architecture technical brief: 148 SMs (2 dies), as b200",
        0.70,
        "assumption: as b200",
        0.50,
        "assumption, as b200",
    ),
    "v100": _table(
        80,
        "NVIDIA Tesla V100 whitepaper (2017): 80 SMs",
        0.80,
        "assumption: cuBLAS fp16 tensor-core GEMMs near 100 of 125 TFLOP/s",
        0.45,
        "assumption: FlashAttention-1 on V100 (Dao et al. 2022 report large gains "
        "but no utilization figure)",
    ),
    "mi300x": _table(
        304,
        "AMD CDNA 3 white paper: 304 compute units",
        0.55,
        "assumption: hipBLASLt reaches about half of the datasheet peak",
        0.40,
        "assumption: CK flash attention, below GEMM rate",
    ),
    "l4": _table(
        58,
        "NVIDIA Ada GPU architecture whitepaper: 58 SMs (L4)",
        0.65,
        "assumption: 72 W part, clocks drop under load",
        0.45,
        "assumption",
    ),
}
"""Kernel figures per catalog accelerator (absent: the plain roofline with the catalog's
matmul efficiency, as for the `cpu` test device)."""


class Kernels(Protocol):
    """What the stage model prices a layer's kernels with: the catalog's `KernelModel`, or a
    measured one (`planner/cost/calibrated.py`, from `paraplan calibrate`)."""

    @property
    def launch_s(self) -> float:
        """Fixed seconds per kernel (per operator dispatch on a CPU): launch, dispatch and the
        idle gap between back-to-back kernels."""
        ...

    def gemm_train_s(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(forward, backward) seconds of a GEMM (m x k) @ (k x n) in training."""
        ...

    def attention_s(
        self,
        dense_fwd_flops: float,
        causal: bool = True,
        head_dim: int | None = None,
        seq_len: int | None = None,
    ) -> tuple[float, float]:
        """(forward, backward) seconds of fused attention of `dense_fwd_flops` (unmasked) with
        heads `head_dim` wide (None: a typical head size) over sequences of `seq_len` tokens
        (None: not known; a measured CPU curve reads its rate there)."""
        ...

    def math_attention_s(
        self, batch_heads: int, seq_q: int, seq_k: int, head_dim: int, core_bytes: float
    ) -> tuple[float, float]:
        """(forward, backward) seconds of unfused attention."""
        ...

    def elementwise_s(self, nbytes: float) -> float:
        """Seconds to stream `nbytes` through memory-bound kernels."""
        ...


class KernelModel:
    """Seconds of GEMMs and attention on one accelerator in one dtype (memoized)."""

    launch_s = 0.0
    """Catalog devices: kernel launches overlap the previous kernel (the host runs ahead)."""

    def __init__(
        self, acc: Accelerator, dtype: str, table: KernelTable, fused_attention: bool = False
    ) -> None:
        self.peak_flops_per_s = acc.peak_flops_for(dtype)
        self.memory_bw_bytes_per_s = acc.memory_bw_bytes_per_s
        self.table = table
        self.attention_efficiency = (
            table.fused_attention_efficiency if fused_attention else table.attention_efficiency
        )
        """Rate of the attention kernel the framework runs, as a fraction of the peak."""
        self.dtype_bytes = 4 if dtype in ("fp32", "tf32") else (1 if dtype == "fp8" else 2)
        self.gemm_s = cache(self._gemm_s)

    def _gemm_s(self, m: int, n: int, k: int) -> float:
        """Seconds of one (m x k) @ (k x n) GEMM."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        t = self.table
        per_sm = self.peak_flops_per_s * min(1.0, t.gemm_efficiency * GEMM_SCALE) / t.sm_count
        best = math.inf
        for tile in t.tiles:
            tiles = math.ceil(m / tile.m) * math.ceil(n / tile.n)
            waves = math.ceil(tiles / t.sm_count)
            flops_per_tile = 2.0 * tile.m * tile.n * (k + t.k_overhead)
            best = min(best, waves * flops_per_tile / (per_sm * tile.rate))
        memory = self.dtype_bytes * (m * k + k * n + m * n) / self.memory_bw_bytes_per_s
        return max(best, memory)

    def gemm_train_s(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(forward, backward) seconds of a GEMM (m, n, k) in training."""
        return self.gemm_s(m, n, k), self.gemm_s(m, k, n) + self.gemm_s(k, n, m)

    def math_attention_s(
        self, batch_heads: int, seq_q: int, seq_k: int, head_dim: int, core_bytes: float
    ) -> tuple[float, float]:
        """(forward, backward) seconds of unfused attention (Megatron-LM before flash
        attention): batched GEMMs QK^T and AV over every (sequence, head) with K = head_dim and
        K = seq_k, computing the whole score matrix (no causal saving), plus the memory-bound
        scale-mask-softmax and dropout kernels, which write what they save (`core_bytes`: the
        probabilities, dropout mask and output) after reading the scores, and in backward read
        it back and write the score gradients (assumption: 2x and 3x `core_bytes` of traffic)."""
        m = batch_heads * seq_q
        qk, av = self.gemm_s(m, seq_k, head_dim), self.gemm_s(m, head_dim, seq_k)
        qk_b = self.gemm_s(m, head_dim, seq_k) + self.gemm_s(seq_k, head_dim, m)
        av_b = self.gemm_s(m, seq_k, head_dim) + self.gemm_s(seq_k, head_dim, m)
        bw = self.memory_bw_bytes_per_s * MEMORY_EFFICIENCY
        return qk + av + 2 * core_bytes / bw, qk_b + av_b + 3 * core_bytes / bw

    def elementwise_s(self, nbytes: float) -> float:
        """Seconds to stream `nbytes` through memory-bound kernels."""
        return nbytes / (self.memory_bw_bytes_per_s * MEMORY_EFFICIENCY)

    def attention_s(
        self,
        dense_fwd_flops: float,
        causal: bool = True,
        head_dim: int | None = None,
        seq_len: int | None = None,
    ) -> tuple[float, float]:
        """(forward, backward) seconds of flash attention whose dense (unmasked) forward
        count is `dense_fwd_flops` (the catalog's attention efficiency is one figure per
        accelerator, whatever `head_dim` and `seq_len`)."""
        executed = dense_fwd_flops * (CAUSAL_FRACTION if causal else 1.0)
        rate = self.peak_flops_per_s * min(1.0, self.attention_efficiency * ATTENTION_SCALE)
        return executed / rate, ATTENTION_BACKWARD_FACTOR * executed / rate


@dataclass(frozen=True, slots=True)
class Gemm:
    """One matmul of a layer's forward, per sequence: (tokens x k) @ (k x n)."""

    n: int
    """Output features (on one rank)."""
    k: int
    """Reduction size (on one rank)."""
    per_token: float
    """Multiplicity: how many times per token it runs (routed experts: top_k)."""


def layer_gemms(profile: ModelProfile, layer: LayerCost, tp: int) -> tuple[Gemm, ...] | None:
    """The forward GEMMs of a standard transformer block or head on one TP rank (Megatron's
    column/row split: Narayanan et al. 2021 §3.2), or None when the layer's FLOPs do not
    match that shape (then the caller prices it by the roofline)."""
    p = profile
    h, s = p.hidden, p.seq_len
    if layer.kind == LayerKind.HEAD:
        gemms: tuple[Gemm, ...] = (Gemm(n=max(1, p.vocab // tp), k=h, per_token=1.0),)
        return gemms if _matches(layer.fwd_flops, gemms, s, tp, h) else None
    if layer.kind != LayerKind.BLOCK or p.heads < 1:
        return None
    q, kv = p.q_dim, p.kv_dim
    attn = (
        Gemm(n=max(1, (q + 2 * kv) // tp), k=h, per_token=1.0),
        Gemm(n=h, k=max(1, q // tp), per_token=1.0),
    )
    mlp_flops = layer.fwd_flops - layer.attn_core_fwd_flops - 2 * s * h * (q + 2 * kv + q)
    routed = float(p.top_k) if p.is_moe else 1.0
    if p.is_moe:
        mlp_flops -= 2 * s * h * p.experts  # the router
    mats = mlp_flops / (2 * s * h * p.ffn * routed)
    if abs(mats - round(mats)) > 0.05 or round(mats) not in (2, 3):
        return None
    up = Gemm(n=max(1, (round(mats) - 1) * p.ffn // tp), k=h, per_token=routed)
    down = Gemm(n=h, k=max(1, p.ffn // tp), per_token=routed)
    return (*attn, up, down)


def every_other_matmul(profile: ModelProfile, tp: int, gated: bool) -> tuple[Gemm, ...]:
    """The forward GEMMs torchtitan's per-operator selective checkpointing recomputes in a
    block on one TP rank: its policy counts the block's matmuls in execution order and saves
    the odd ones, recomputing the 2nd, 4th and 6th (torchtitan/distributed/
    activation_checkpoint.py, `_get_custom_policy`). With separate projections that order is
    q, k, v, o, then w1, w3, w2 (gated MLP) or fc1, fc2: k, o and w3 (or fc2) are recomputed."""
    p = profile
    h, q, kv = p.hidden, p.q_dim, p.kv_dim
    mlp = (
        Gemm(n=max(1, p.ffn // tp), k=h, per_token=1.0)  # w3
        if gated
        else Gemm(n=h, k=max(1, p.ffn // tp), per_token=1.0)  # fc2
    )
    return (
        Gemm(n=max(1, kv // tp), k=h, per_token=1.0),  # k
        Gemm(n=h, k=max(1, q // tp), per_token=1.0),  # o
        mlp,
    )


EAGER_NORM_PASSES = 7
"""Element passes of one eager RMSNorm/LayerNorm over its (tokens x h) input: square, mean
(read), scale by the reciprocal root (read, write), weight multiply (read, write), each its own
kernel (torch's composite norms; a fused norm reads once and writes once)."""
EAGER_ROPE_PASSES = 6
"""Element passes of eager rotary embeddings over q and k: cast and complex/real multiply and
cast back (read + write each; torchtitan's and Hugging Face's formulations)."""
EAGER_BACKWARD_FACTOR = 2.0
"""An elementwise operator's backward streams about twice its forward: it reads the output
gradient and the saved input and writes the input gradient (multiplies produce two)."""
EAGER_BLOCK_KERNELS = 36
"""Kernels one eager block launches in forward (4 GEMMs, attention, 2 norms of 5 operators,
rotary, 2 residual adds, activation and multiply, layout copies): what `Kernels.launch_s` is
charged for (backward: twice as many)."""


def eager_block_elements(profile: ModelProfile, tp: int, sp: bool, gated: bool) -> float:
    """Elements per token one TP rank's eager elementwise kernels stream in a block's forward
    (reads plus writes), beyond what a fused implementation does in its GEMM epilogues:
    two norms and two residual adds over h (split by SP), rotary over q and k and the
    attention output's layout copy over the head dimension (split by TP), and the MLP
    activation over the FFN width (SwiGLU: silu, then a multiply of two inputs; GELU: one
    pass). Llama-family blocks (gated MLP) carry rotary embeddings."""
    p = profile
    h, q, kv = p.hidden, p.q_dim, p.kv_dim
    along_h = (2 * EAGER_NORM_PASSES + 2 * 3) * h / (tp if sp else 1)
    attention = (EAGER_ROPE_PASSES * (q + kv) if gated else 0) / tp + 2 * q / tp
    mlp = (5 if gated else 2) * p.ffn / tp
    return along_h + attention + mlp


def is_math_attention(profile: ModelProfile, layer: LayerCost) -> bool:
    """Whether the block's attention keeps the score matrix (at least one byte per score and
    head: unfused attention); a fused kernel keeps only O and the log-sum-exp."""
    return layer.act_attn_core_bytes >= profile.heads * profile.seq_len**2


def _matches(fwd_flops: float, gemms: tuple[Gemm, ...], s: int, tp: int, h: int) -> bool:
    total = sum(2 * s * g.n * g.k * g.per_token * tp for g in gemms)
    return fwd_flops > 0 and abs(total - fwd_flops) <= 0.05 * fwd_flops
