"""Attention as a fused kernel when profiling on the meta device.

Under fake/meta tensors, SDPA has no fused kernel and decomposes into the math path, which
keeps the s x s scores for backward — what no real training run on a GPU does (they use flash
or memory-efficient kernels, Dao et al. 2022), and which would overstate a 405B model's
activations many times over. In meta mode every `scaled_dot_product_attention` call is
therefore run as PyTorch's fused CPU flash kernel op (it has meta kernels and an autograd
formula): it keeps q, k, v, the output and the log-sum-exp, like the GPU kernels. An explicit
mask is replaced by the kernel's causal flag (decoders) or dropped (encoders): Hugging Face
builds such masks under fake tensors only because it cannot inspect their values.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .env import scoped_env

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


_EAGER_AS_FUSED = "paraplan_fused"
"""The Hugging Face attention implementation `FusedAttention` registers for a model whose
attention is eager: transformers runs some models only eagerly (`_supports_sdpa` False:
gpt-oss, whose sinks SDPA cannot take), and a config may ask for it."""


class FusedAttention(TorchFunctionMode):
    """Redirects SDPA to the fused flash op, causal for decoders; with `model`, a Hugging Face
    model whose attention is eager (matmuls keeping the s x s probabilities) runs the same
    fused op through transformers' attention interface for as long as the mode is on. The
    fused kernels real runs use take what eager adds (gpt-oss's sinks: one logit a head, in
    FlashAttention-3 and Transformer Engine's `softmax_type`); the trace leaves it out."""

    def __init__(self, causal: bool, model: Any = None) -> None:
        super().__init__()
        self.causal = causal
        self.model = model
        self._env = contextlib.ExitStack()

    def __enter__(self) -> FusedAttention:
        # With a mask present, Hugging Face repeats K/V heads for GQA instead of letting the
        # kernel share them; the real (mask-free) run shares them, so force the same here.
        self._env.enter_context(scoped_env(_FORCE_GQA, "1"))
        self._env.enter_context(self._eager_as_fused())
        return super().__enter__()  # type: ignore[return-value]

    @contextlib.contextmanager
    def _eager_as_fused(self) -> Any:
        config: Any = getattr(self.model, "config", None)
        if getattr(config, "_attn_implementation", None) != "eager":
            yield
            return
        from transformers import AttentionInterface

        causal = self.causal

        def fused(module: Any, query: Any, key: Any, value: Any, mask: Any, **kw: Any) -> Any:
            # transformers' interface: (B, H, S, D) in, (B, S, H, D) and no weights out
            query, key, value = _autocast(query, key, value)
            dropout = float(kw.get("dropout") or 0.0)
            out = _flash(query, key, value, dropout, causal, kw.get("scaling"))
            return out.transpose(1, 2).contiguous(), None

        AttentionInterface.register(_EAGER_AS_FUSED, fused)
        config._attn_implementation = _EAGER_AS_FUSED
        try:
            yield
        finally:
            config._attn_implementation = "eager"

    def __exit__(self, *exc: Any) -> None:
        self._env.close()
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        bound = dict(zip(names, args, strict=False)) | kwargs
        q, k, v = _autocast(bound["query"], bound["key"], bound["value"])
        causal = bool(bound.get("is_causal")) or (
            self.causal and bound.get("attn_mask") is not None
        )
        # (enable_gqa is implied: the kernel shares K/V heads across query-head groups)
        return _flash(q, k, v, float(bound.get("dropout_p") or 0.0), causal, bound.get("scale"))


def _flash(q: Any, k: Any, v: Any, dropout: float, causal: bool, scale: Any) -> Any:
    """The fused flash op's output. Values narrower than queries and keys (DeepSeek's MLA:
    qk 192, v 128 per head) are zero-padded to their width and the output cut back, as
    Hugging Face runs such models under FlashAttention-2 (whose kernels take one head width):
    the op's meta kernel shapes its output as the queries."""
    width = v.shape[-1]
    narrow = width < q.shape[-1]
    if narrow:
        v = F.pad(v, (0, q.shape[-1] - width))
    out, _lse = _FLASH(q, k, v, dropout, causal, scale=scale)
    return out[..., :width] if narrow else out


def _autocast(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """q, k and v as autocast casts SDPA's inputs where it is on (`autocast_trace.py`)."""
    device = q.device.type
    if device != "meta" and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v
