"""Transformers described by their sizes, the presets, and their layer chain.

The per-layer formulas follow Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (§4.1 activation memory, Table 2) and Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (Eq. 3, FLOPs),
generalized to GQA, SwiGLU, MoE and fused (flash) attention; docs/cost-model.md lists each term.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from . import limits
from .limits import show_number
from .model import LayerCost, LayerKind, ModelProfile, attention_pairs

MASK_BYTES = 1
"""A dropout mask stores one byte per element (Korthikanti et al. 2022 §4.1)."""
INDEX_BYTES = 8
"""Token ids are int64; the embedding's backward keeps them."""
LOGITS_FP32_BYTES = 4
"""The cross-entropy loss keeps fp32 logits/softmax (Korthikanti et al. 2022 §4.1, 4sbv)."""
LSE_BYTES = 4
"""Fused attention keeps the fp32 log-sum-exp per head and query (Dao et al. 2022 §3.1)."""


class FfnKind(StrEnum):
    """MLP form: GELU (2 matrices) or SwiGLU (3 matrices, Shazeer 2020)."""

    GELU = "gelu"
    SWIGLU = "swiglu"


class Attention(StrEnum):
    """Attention kernel: `math` stores the s x s scores; `flash` stores only O and the LSE."""

    MATH = "math"
    FLASH = "flash"


class Norm(StrEnum):
    """LayerNorm (weight and bias) or RMSNorm (weight only)."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


RMSNORM_EXTRA = {Norm.LAYERNORM: 0, Norm.RMSNORM: 1}
"""Extra (b, s, h) tensors a norm keeps beyond its input: Hugging Face's unfused RMSNorm keeps
the normalized hidden for the weight multiply; LayerNorm keeps only mean and rstd."""


_BOUNDS = {
    "layers": limits.LAYERS,
    "hidden": limits.HIDDEN,
    "heads": limits.HEADS,
    "vocab": limits.VOCAB,
    "seq": limits.SEQ_LEN,
    "kv_heads": limits.HEADS,
    "ffn": limits.FFN,
    "experts": limits.EXPERTS,
    "expert_ffn": limits.FFN,
    "head_dim": limits.HIDDEN,
    "sliding_window": limits.SEQ_LEN,
    "full_attention_every": limits.LAYERS,
}
"""The bound of each size (0 means "the default" for the optional ones and is not checked)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerSpec:
    """A decoder-only transformer by its sizes."""

    name: str = "custom"
    """Name shown in plans."""
    layers: int
    """Number of transformer blocks."""
    hidden: int
    """Model width h."""
    heads: int
    """Attention heads a."""
    kv_heads: int = 0
    """Key/value heads (GQA); 0 means equal to `heads`."""
    ffn: int = 0
    """MLP inner size; 0 means 4*hidden."""
    ffn_kind: FfnKind = FfnKind.GELU
    """GELU MLP or SwiGLU."""
    vocab: int
    """Vocabulary size V."""
    seq: int = 2048
    """Context length (learned position embeddings have this many rows)."""
    tied_embeddings: bool = False
    """Whether the output head reuses the embedding matrix."""
    learned_pos: bool = False
    """Learned absolute position embeddings (GPT) rather than rotary (Llama)."""
    bias: bool = False
    """Linear layers carry biases (GPT-2/3) or not (Llama)."""
    norm: Norm = Norm.RMSNORM
    """Normalization layer."""
    dropout: bool = False
    """Training with dropout: masks are saved for backward (Korthikanti §4.1)."""
    attention: Attention = Attention.FLASH
    """Attention kernel."""
    experts: int = 0
    """MoE experts per block (0: dense)."""
    top_k: int = 0
    """Experts per token (MoE)."""
    expert_ffn: int = 0
    """Inner size of each expert's MLP; 0 means `ffn`."""
    head_dim: int = 0
    """Width of each attention head; 0 means hidden / heads. Qwen3, Gemma and GPT-OSS set it
    apart from the hidden size (Qwen3-32B: 64 heads of 128 over a hidden size of 5120), so the
    query and attention-output projections are hidden x heads*head_dim, not hidden x hidden."""
    sliding_window: int = 0
    """Keys each query attends to in the sliding-window blocks: itself and the w - 1 before it,
    as Hugging Face's `sliding_window` (Mistral, Gemma 2/3, GPT-OSS); 0: every block attends
    to the whole sequence."""
    full_attention_every: int = 0
    """With a sliding window, every n-th block (indices n-1, 2n-1, ...) attends to the whole
    sequence (GPT-OSS alternates: 2; Gemma 3: 6); 0: every block is windowed (Mistral)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"model {self.name!r}: {name}={show_number(value)} must be a positive integer"
                )
        optional = ("kv_heads", "ffn", "experts", "top_k", "expert_ffn", "head_dim")
        for name in (*optional, "sliding_window", "full_attention_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"model {self.name!r}: {name}={show_number(value)} must be a non-negative "
                    "integer"
                )
        for name, bound in _BOUNDS.items():  # before any arithmetic on the sizes
            if getattr(self, name):  # 0 is "the default" for the optional sizes
                bound.check(getattr(self, name), f"model {self.name!r}: {name}")
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.head_dim == 0 and self.hidden % self.heads:
            raise ValueError(
                f"model {self.name!r}: hidden={self.hidden} is not divisible by heads="
                f"{self.heads}; pick heads that divide the hidden size, or give head_dim"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"model {self.name!r}: heads={self.heads} is not a multiple of kv_heads="
                f"{self.kv_heads}; GQA needs kv_heads to divide heads"
            )
        if self.full_attention_every and not self.sliding_window:
            raise ValueError(
                f"model {self.name!r}: full_attention_every={self.full_attention_every} given "
                "without sliding_window; set sliding_window=W (keys per query) or drop it"
            )
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(
                    f"model {self.name!r}: top_k={self.top_k} must be between 1 and "
                    f"experts={self.experts} for a MoE model"
                )
            if self.expert_ffn == 0:
                object.__setattr__(self, "expert_ffn", self.ffn)
        elif self.top_k or self.expert_ffn:
            raise ValueError(
                f"model {self.name!r}: top_k/expert_ffn given without experts; set experts=N "
                "for a MoE model or drop them"
            )

    @property
    def head_size(self) -> int:
        """Width of each attention head: `head_dim`, or hidden / heads (not filled in: a
        `dataclasses.replace` of the sizes must not carry a derived width along)."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of Q and of the attention output: heads x head size (h unless head_dim is
        set apart)."""
        return self.heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_size

    def window_of(self, index: int) -> int:
        """Keys each query of block `index` attends to (0: the whole sequence)."""
        every = self.full_attention_every
        return 0 if every and (index + 1) % every == 0 else self.sliding_window

    # ---- parameters ---------------------------------------------------------------------
    def _norm_params(self) -> int:
        return 2 * self.hidden if self.norm == Norm.LAYERNORM else self.hidden

    def _mlp_params(self, inner: int) -> int:
        h, b = self.hidden, self.bias
        if self.ffn_kind == FfnKind.SWIGLU:
            return 3 * h * inner + (2 * inner + h if b else 0)
        return 2 * h * inner + (inner + h if b else 0)

    def block_params(self) -> tuple[int, int]:
        """(dense, expert) parameters of one block."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * (q + 2 * kv) + q * h + ((q + 2 * kv) + h if self.bias else 0)
        dense = attn + 2 * self._norm_params()
        if self.experts:
            router = h * self.experts
            return dense + router, self.experts * self._mlp_params(self.expert_ffn)
        return dense + self._mlp_params(self.ffn), 0

    def embedding_params(self) -> int:
        """Token (and learned position) embedding parameters."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_pos else 0)

    def head_params(self) -> int:
        """Final norm plus output projection (zero extra when tied)."""
        return self._norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def num_params(self) -> int:
        """Exact parameter count."""
        dense, expert = self.block_params()
        return self.embedding_params() + self.layers * (dense + expert) + self.head_params()

    # ---- per-layer costs ----------------------------------------------------------------
    def block_cost(self, index: int, seq_len: int, act_bytes: int) -> LayerCost:
        """One block, per sequence of `seq_len` tokens with `act_bytes`-byte activations."""
        s, h, a, kv, p = seq_len, self.hidden, self.heads, self.kv_dim, act_bytes
        q = self.q_dim
        mask = MASK_BYTES if self.dropout else 0
        # Matmul FLOPs, 2 per multiply-add (Narayanan et al. 2021 §5.1).
        qkv_proj_flops = 2 * s * h * (q + 2 * kv) + 2 * s * q * h
        # QK^T and AV over all heads, no causal discount (a window: its band, both sides)
        window = self.window_of(index)
        attn_core_flops = 2 * 2 * attention_pairs(s, window) * q
        if self.ffn_kind == FfnKind.SWIGLU:
            mlp_mats, mlp_saved = 3, 4  # gate/up/down; saves gate, up, silu(gate), product
        else:
            mlp_mats, mlp_saved = 2, 2  # fc1/fc2; saves GELU input and output
        routed = self.top_k if self.experts else 1
        if self.experts:
            inner = self.expert_ffn
            mlp_flops = 2 * s * h * self.experts + self.top_k * 2 * mlp_mats * s * h * inner
            # routed copies of the token (dispatch input, combine input), replicated across TP
            moe_replicated = 2 * self.top_k * p * s * h + p * s * self.experts
        else:
            inner = self.ffn
            mlp_flops = 2 * mlp_mats * s * h * inner
            moe_replicated = 0
        mlp_tp_bytes = routed * mlp_saved * p * s * inner
        # silu(gate): kept by eager torch's multiply, not by a fused SwiGLU
        glu_copy = routed * p * s * inner if self.ffn_kind == FfnKind.SWIGLU else 0
        fwd_flops = qkv_proj_flops + attn_core_flops + mlp_flops
        # Activations saved for backward (Korthikanti et al. 2022 §4.1, generalized).
        # Replicated across TP ranks: norm1 input, QKV input, norm2 input, MLP input, 2 masks;
        # an RMSNorm as Hugging Face writes it (unfused) also keeps x * rsqrt(var) for the
        # weight multiply: one more (b, s, h) tensor per norm (measured, docs/cost-model.md).
        replicated = 4 * p * s * h + 2 * mask * s * h + moe_replicated
        norm_copy = 2 * p * s * h * RMSNORM_EXTRA[self.norm]
        replicated += norm_copy
        if self.attention == Attention.MATH:
            # softmax output (p), its dropout mask and dropout output (Korthikanti: 5as^2).
            core = (p + mask + (p if self.dropout else 0)) * a * s * s
        else:
            core = LSE_BYTES * a * s  # fused kernel keeps O (= proj input) and the LSE only
        tp_bytes = p * s * (q + 2 * kv) + p * s * q + core + mlp_tp_bytes  # Q,K,V, proj in
        dense, expert = self.block_params()
        return LayerCost(
            name=f"block.{index}",
            kind=LayerKind.BLOCK,
            params=dense,
            expert_params=expert,
            fwd_flops=float(fwd_flops),
            bwd_flops=float(2 * fwd_flops),
            attn_core_fwd_flops=float(attn_core_flops),
            attn_window=window if 0 < window < s else 0,
            act_tp_bytes=float(tp_bytes),
            act_replicated_bytes=float(replicated),
            act_attn_core_bytes=float(core),
            act_norm_copy_bytes=float(norm_copy),
            act_glu_copy_bytes=float(glu_copy),
            input_bytes=float(p * s * h),
            output_bytes=float(p * s * h),
        )

    def to_profile(self, seq_len: int | None = None, act_bytes: int = 2) -> ModelProfile:
        """The layer chain (embedding, blocks, head) for sequences of `seq_len` tokens."""
        s = self.seq if seq_len is None else seq_len
        limits.SEQ_LEN.check(s, "seq_len")
        if self.learned_pos and s > self.seq:
            raise ValueError(
                f"model {self.name!r}: seq_len={s} exceeds its {self.seq} learned positions; "
                f"use --seq-len <= {self.seq} or a model with seq>={s}"
            )
        h, v, p = self.hidden, self.vocab, act_bytes
        mask = MASK_BYTES if self.dropout else 0
        embedding = LayerCost(
            name="embedding",
            kind=LayerKind.EMBEDDING,
            params=self.embedding_params(),
            fwd_flops=0.0,
            bwd_flops=0.0,
            act_tp_bytes=0.0,
            act_replicated_bytes=float(INDEX_BYTES * s + mask * s * h),
            input_bytes=float(INDEX_BYTES * s),
            output_bytes=float(p * s * h),
        )
        head_flops = 2 * s * h * v
        head = LayerCost(
            name="head",
            kind=LayerKind.HEAD,
            params=self.head_params(),
            fwd_flops=float(head_flops),
            bwd_flops=float(2 * head_flops),
            # final-norm input and head input (replicated), fp32 logits for the loss (vocab-
            # parallel): Korthikanti et al. 2022 §4.1, 4sbh/t (1 + v/h).
            act_tp_bytes=float(LOGITS_FP32_BYTES * s * v),
            act_replicated_bytes=float((2 + RMSNORM_EXTRA[self.norm]) * p * s * h),
            act_norm_copy_bytes=float(RMSNORM_EXTRA[self.norm] * p * s * h),  # the final norm's
            input_bytes=float(p * s * h),
            output_bytes=float(LOGITS_FP32_BYTES),
        )
        blocks = tuple(self.block_cost(i, s, p) for i in range(self.layers))
        return ModelProfile(
            name=self.name,
            layers=(embedding, *blocks, head),
            seq_len=s,
            act_dtype_bytes=p,
            hidden=h,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn=self.expert_ffn if self.experts else self.ffn,
            vocab=v,
            experts=self.experts,
            top_k=self.top_k,
            tied_embeddings=self.tied_embeddings,
            head_dim=self.head_dim,  # 0: h / heads
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (the `--model file.json` format)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_GPT: dict[str, Any] = {"learned_pos": True, "bias": True, "norm": Norm.LAYERNORM, "dropout": True}
GPT_MATH: dict[str, Any] = {**_GPT, "attention": Attention.MATH}
_LLAMA3: dict[str, Any] = {"ffn_kind": FfnKind.SWIGLU, "vocab": 128256, "seq": 8192, "kv_heads": 8}

_GPT_OSS: dict[str, Any] = {
    "hidden": 2880,
    "heads": 64,
    "kv_heads": 8,
    "head_dim": 64,
    "ffn": 2880,
    "ffn_kind": FfnKind.SWIGLU,
    "vocab": 201088,
    "seq": 131072,
    "top_k": 4,
    "bias": True,
    "sliding_window": 128,
    "full_attention_every": 2,
}

PRESETS: dict[str, TransformerSpec] = {
    # GPT-2: Radford et al. 2019, Table 2; 124,439,808 params with the 50,257-token vocab.
    "gpt2": TransformerSpec(
        name="gpt2",
        layers=12,
        hidden=768,
        heads=12,
        vocab=50257,
        seq=1024,
        tied_embeddings=True,
        **GPT_MATH,
    ),
    "gpt2-xl": TransformerSpec(
        name="gpt2-xl",
        layers=48,
        hidden=1600,
        heads=25,
        vocab=50257,
        seq=1024,
        tied_embeddings=True,
        **GPT_MATH,
    ),
    # GPT-3 175B: Brown et al. 2020, Table 2.1 (96 layers, d=12288, 96 heads, 2048 context).
    "gpt3-175b": TransformerSpec(
        name="gpt3-175b",
        layers=96,
        hidden=12288,
        heads=96,
        vocab=50257,
        seq=2048,
        tied_embeddings=True,
        **GPT_MATH,
    ),
    # Llama 3 herd: Dubey et al. 2024, Table 3.
    "llama3-8b": TransformerSpec(
        name="llama3-8b", layers=32, hidden=4096, heads=32, ffn=14336, **_LLAMA3
    ),
    "llama3-70b": TransformerSpec(
        name="llama3-70b", layers=80, hidden=8192, heads=64, ffn=28672, **_LLAMA3
    ),
    "llama3-405b": TransformerSpec(
        name="llama3-405b", layers=126, hidden=16384, heads=128, ffn=53248, **_LLAMA3
    ),
    # Mixtral 8x7B: Jiang et al. 2024, Table 1.
    "mixtral-8x7b": TransformerSpec(
        name="mixtral-8x7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        ffn_kind=FfnKind.SWIGLU,
        vocab=32000,
        seq=32768,
        experts=8,
        top_k=2,
    ),
    # gpt-oss: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", §2.1 and Table 1 (36 / 24
    # blocks, 128 / 32 experts of top 4, width 2880, 64 query heads and 8 key/value heads of
    # 64, biased projections, banded attention of 128 tokens alternating with dense attention,
    # the 201,088-token o200k_harmony vocabulary; attention sinks, 64 scalars a block, left
    # out): 116.83B / 20.91B parameters, 5.13B / 3.61B active.
    "gpt-oss-120b": TransformerSpec(name="gpt-oss-120b", layers=36, experts=128, **_GPT_OSS),
    "gpt-oss-20b": TransformerSpec(name="gpt-oss-20b", layers=24, experts=32, **_GPT_OSS),
}
