"""Autocast's own work in mixed-precision training, as the executor runs it without FSDP2.

Under DDP or on a single rank the executor keeps fp32 weights and runs each micro-batch under
`torch.autocast` (`executor/compose.py`): every matmul casts its fp32 weight to bf16/fp16
(read 4 bytes, write 2), the backward casts each weight's gradient back to fp32 (read 2, write
4), and `AccumulateGrad` adds it into the fp32 `.grad` (read 4 + 4, write 4): 24 bytes per
parameter per micro-batch that a profile traced in the compute dtype does not hold (its weights
are already bf16, its gradients accumulate in bf16). FSDP2's `MixedPrecisionPolicy` casts at
the gather instead (not priced here). Measured with `torch.profiler` over one micro-batch of a
1.24B-parameter Llama on an H200 (4 x 2048 tokens, 2026-11-26): the casts 7.7 ms and the fp32
gradient additions 9.6 ms, about 5% of its 180 ms (these bytes price ~9 ms at the calibrated
bandwidth: the additions also count fp32 residual adds).

Priced only on a calibrated device with a traced profile (`cost/eager.py`), whose other
memory-bound work is priced the same way; the catalog's block model is fitted to published
runs (Megatron keeps bf16 weights and fp32 main gradients, a different mechanism).
"""

from __future__ import annotations

from ..config import FP32_BYTES, Precision
from ..strategy import Strategy
from .layout import Stage
from .stages import StageModel

AUTOCAST_BYTES_PER_PARAM = 24
"""Bytes streamed per parameter per micro-batch (module docstring: 6 + 6 + 12)."""
AUTOCAST_FORWARD_SHARE = 0.25
"""Of those, the forward's (the weight casts); the backward has the rest."""


def autocasts(s: Strategy) -> bool:
    """Whether the executor runs `s` under `torch.autocast`: no FSDP2 (whose policy casts),
    and either a single data-parallel rank or DDP (no TP or PP beside data parallelism, which
    run FSDP2's `replicate`): `executor/data_parallel.DataParallelKind.autocasts`."""
    return not s.fsdp_wrapped and (s.dp * s.cp == 1 or (s.tp == 1 and s.pp == 1))


def autocast_s(s: Strategy, stage: Stage, sm: StageModel) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of autocast's casts and fp32 gradient
    accumulation on one rank of `stage`; 0 where the executor does not autocast or the layers
    are not priced op by op (`StageModel.op_by_op_kernels`)."""
    first = sm.profile.layers[stage.layers[0]]
    k = sm.op_by_op_kernels(first)
    if k is None or sm.train.precision == Precision.FP32 or not autocasts(s):
        return 0.0, 0.0
    params = stage.dense_params / s.tp + stage.expert_params / (s.tp * s.ep)
    tensors = sum(sm.profile.layers[i].param_tensors for i in stage.layers)
    t = k.stream_s(params * AUTOCAST_BYTES_PER_PARAM, params * FP32_BYTES / max(1, tensors))
    return AUTOCAST_FORWARD_SHARE * t, (1 - AUTOCAST_FORWARD_SHARE) * t
