"""Multi-token prediction (MTP) trained beside the decoder: the chain it adds.

DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437 §2.2) trains D sequential MTP modules after
its 61 blocks; module k predicts the token k + 1 ahead from (a) the main model's (or module
k - 1's) last hidden state and (b) the embedding of the token k ahead: both RMS-normalized,
concatenated and projected back to the model width by a 2h x h matrix M_k, then one
transformer block TRM_k, then the shared output head and a cross-entropy loss of its own. The
embedding and the head are the main model's; the module owns two norms, the projection, its
block and its final norm. Megatron-Core (`MultiTokenPredictionBlock`, `--mtp-num-layers`),
torchtitan (`MTPTransformerBlock`, `model_registry(num_mtp_layers=)`) and transformers'
`MtpLayer` build it the same way (enorm, hnorm, eh_proj without bias, the decoder's own block
class as the last block is built, a final norm), and Megatron-Core places the modules on the
last pipeline stage, beside the loss.

Priced as each module is (`with_mtp`): a block appended after the decoder's last, costed as
that block (the same class and shape: a MoE block for DeepSeek-V3) plus its projection and
three norms, and one more pass of the head (norm, output layer, loss) in the head's work, its
parameters counted once. The pipeline keeps the modules in the last chunk with the head
(`cost/stage_layout.py`).
"""

from __future__ import annotations

from dataclasses import replace

from .model import LayerCost, LayerKind, ModelProfile, OpElements

NORMS = 3
"""Norms a module owns: enorm, hnorm and its final norm (the block's own come with it)."""
NORM_OPS = (8, 10)
"""Aten operators of an eager RMSNorm, forward and backward (Hugging Face's: the upcast,
pow, mean, add, rsqrt, two multiplies, the downcast; the backward about as many again)."""
EXTRA_OPS = (4, 6)
"""Aten operators of the module's own glue beside its norms, forward and backward: the
embedding lookup of the shifted tokens, the concatenation and the projection's matmul with
its views (a Linear on a 3-D input)."""
NORM_SAVED = 4
"""Tensors an eager RMSNorm saves for backward (its input, the upcast, the reciprocal root,
the weight)."""
NORM_STREAM_PASSES = (6, 10)
"""Passes over the hidden state (in activation bytes) an eager RMSNorm reads and writes,
forward and backward: memory-bound work, tiny beside the block's."""

HEAD_PASS_FIELDS = (
    "fwd_flops", "bwd_flops", "act_tp_bytes", "act_replicated_bytes", "act_norm_copy_bytes",
    "fwd_ops", "bwd_ops", "fwd_stream_bytes", "bwd_stream_bytes", "fwd_written_bytes",
    "bwd_written_bytes", "saved_tensors",
)  # fmt: skip
"""`LayerCost` fields of the head that grow with each pass of it (its work, what it saves, its
operators); its parameters, input and transient peak do not."""


def with_mtp(profile: ModelProfile, modules: int) -> ModelProfile:
    """`profile` with `modules` multi-token-prediction modules trained after its blocks (0:
    the decoder alone, as given). A profile that already has modules in its chain is returned
    as is when the count matches (ValueError otherwise: build from the decoder's profile)."""
    if not isinstance(modules, int) or isinstance(modules, bool) or modules < 0:
        raise ValueError(f"mtp_layers={modules!r} must be a whole number >= 0")
    if profile.mtp_blocks == modules:
        return profile
    if profile.mtp_blocks:
        raise ValueError(
            f"model {profile.name!r} already trains {profile.mtp_blocks} multi-token-prediction "
            f"modules, not {modules}; price it from the decoder's own profile"
        )
    layers = profile.layers
    blocks = [x for x in layers if x.kind == LayerKind.BLOCK]
    last, head = blocks[-1], layers[-1]
    added = tuple(_module(last, profile, k) for k in range(modules))
    chain = (*layers[:-1], *added, _heads(head, 1 + modules))
    return replace(profile, layers=chain, mtp_blocks=modules)


def _module(block: LayerCost, p: ModelProfile, k: int) -> LayerCost:
    """MTP module k as a chain layer: `block` (the decoder's last, whose class and shape the
    module's block has) with the module's projection and norms. Its input and output are
    a hidden state as the block's: the modules and the head share the last chunk, so a
    pipeline boundary falls only before the first module, where the decoder's hidden state
    crosses (the shifted tokens' embeddings are looked up again on that stage)."""
    h, b = p.hidden, p.act_dtype_bytes
    hidden_seq_bytes = float(p.seq_len * h * b)
    proj_fwd_flops = 2.0 * p.seq_len * (2 * h) * h  # eh_proj: 2 per multiply-add
    # saved beside the block's, all of it whole on every TP rank (a shard under SP): each
    # norm's input (enorm's is the embedding, hnorm's the hidden state, then the final norm's)
    # and its normalized copy (what a fused norm does not keep: `act_norm_copy_bytes`), and
    # the projection's input, both normalized halves concatenated
    copies_bytes = NORMS * hidden_seq_bytes
    extra_bytes = NORMS * hidden_seq_bytes + copies_bytes + 2 * hidden_seq_bytes
    f_ops, b_ops = NORM_OPS
    return replace(
        block,
        name=f"mtp.{k}",
        params=block.params + 2 * h * h + NORMS * h,
        fwd_flops=block.fwd_flops + proj_fwd_flops,
        bwd_flops=block.bwd_flops + 2 * proj_fwd_flops,  # input and weight gradients
        act_replicated_bytes=block.act_replicated_bytes + extra_bytes,
        act_norm_copy_bytes=block.act_norm_copy_bytes + copies_bytes,
        fwd_time_s=_scaled(block.fwd_time_s, block.fwd_flops, proj_fwd_flops),
        bwd_time_s=_scaled(block.bwd_time_s, block.bwd_flops, 2 * proj_fwd_flops),
        fwd_ops=block.fwd_ops + NORMS * f_ops + EXTRA_OPS[0] if block.fwd_ops else 0,
        bwd_ops=block.bwd_ops + NORMS * b_ops + EXTRA_OPS[1] if block.bwd_ops else 0,
        fwd_stream_bytes=block.fwd_stream_bytes + NORMS * NORM_STREAM_PASSES[0] * hidden_seq_bytes,
        bwd_stream_bytes=block.bwd_stream_bytes + NORMS * NORM_STREAM_PASSES[1] * hidden_seq_bytes,
        param_tensors=block.param_tensors + 1 + NORMS,
        param_tensor_sizes=(
            (h, h, 2 * h * h, *block.param_tensor_sizes, h) if block.param_tensor_sizes else ()
        ),
        saved_tensors=(block.saved_tensors + NORMS * NORM_SAVED + 2 if block.saved_tensors else 0),
        autocast_saved_bytes=(
            None if block.autocast_saved_bytes is None else block.autocast_saved_bytes + extra_bytes
        ),
    )


def _scaled(seconds: float | None, flops: float, more_flops: float) -> float | None:
    """A measured block time grown with the module's projection at the block's own rate (None:
    not measured, the roofline prices the module)."""
    if seconds is None or flops <= 0:
        return seconds
    return seconds * (flops + more_flops) / flops


def _heads(head: LayerCost, passes: int) -> LayerCost:
    """The head run `passes` times (the main model's and each module's: norm, output layer,
    loss on the shared weights): its work, what it saves and its operators scale, its
    parameters, transient peak (one pass at a time) and input (the decoder's hidden state:
    the modules run in its chunk, `cost/stage_layout.py`) do not."""
    if passes == 1:
        return head

    def times(x: float | None) -> float | None:
        return None if x is None else x * passes

    def special(ops: tuple[OpElements, ...]) -> tuple[OpElements, ...]:
        return tuple(replace(o, elems=o.elems * passes) for o in ops)

    scaled = {name: getattr(head, name) * passes for name in HEAD_PASS_FIELDS}
    return replace(
        head,
        **scaled,
        fwd_time_s=times(head.fwd_time_s),
        bwd_time_s=times(head.bwd_time_s),
        fwd_special=special(head.fwd_special),
        bwd_special=special(head.bwd_special),
        autocast_saved_bytes=times(head.autocast_saved_bytes),
    )
