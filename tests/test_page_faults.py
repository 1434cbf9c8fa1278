"""Fresh outputs past the allocator's mmap threshold (`cost/calibrated.py`,
`profiler/microbench_stream.py`): the tracer counts the bytes operators write to fresh outputs,
the calibration measures what first touching fresh pages costs, and a head whose fp32 logits
reach the threshold pays it on those bytes, from the threshold on and not before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from paraplan.planner.config import Precision, TrainConfig
from paraplan.planner.cost.calibrated import MMAP_THRESHOLD_BYTES, CalibratedKernels
from paraplan.planner.cost.eager import traced_layer_s
from paraplan.planner.model import LayerKind
from paraplan.profiler.api import profile

from .test_calibration import _fit
from .test_eager_ops import _Chain

FAULT_S_PER_BYTE = 1e-9


class _InPlace(nn.Module):
    """y = tanh((x * 2) += 1): the multiply and tanh write fresh outputs, the add writes in
    place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        y.add_(1.0)
        return torch.tanh(y)


def test_written_bytes_count_fresh_outputs_only() -> None:
    """On (2, 8, 16) fp32, the block writes two fresh tensors of 8 x 16 x 4 bytes per
    sequence (the multiply's and tanh's); the in-place add writes none."""
    x = torch.randn(2, 8, 16)
    prof = profile(_Chain(_InPlace), (x,), blocks="blocks", loss_fn=lambda y: y.sum())
    block = prof.layers[1]
    assert block.fwd_written_bytes == 2 * 8 * 16 * 4
    assert block.bwd_written_bytes > 0


def test_fresh_outputs_are_priced_only_past_the_threshold() -> None:
    k = CalibratedKernels(
        dataclasses.replace(_fit(), page_fault_s_per_byte=FAULT_S_PER_BYTE), time_scale=2.0
    )
    assert k.fresh_output_s(1e6, MMAP_THRESHOLD_BYTES - 1) == 0.0
    assert k.fresh_output_s(1e6, MMAP_THRESHOLD_BYTES) == pytest.approx(1e6 * 1e-9 * 2.0)
    assert k.fresh_output_s(0.0, 4 * MMAP_THRESHOLD_BYTES) == 0.0


def test_a_head_pays_page_faults_once_its_fp32_logits_reach_the_threshold(
    tmp_path: Path,
) -> None:
    """A GPT-2 head with an 8192-token vocabulary at sequence 256: 3 sequences make 24 MiB of
    fp32 logits, 4 make exactly 32 MiB. With no per-operator cost and GEMMs left out, every
    other term of the head's forward grows linearly with the batch; the step from 3 to 4
    sequences adds exactly the fault charge on the bytes its operators write fresh."""
    pytest.importorskip("transformers")
    import paraplan

    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 1,
        "n_embd": 64,
        "n_head": 2,
        "vocab_size": 8192,
        "n_positions": 256,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "gpt2-wide-vocab.json"
    path.write_text(json.dumps(config))
    p = paraplan.model_profile(str(path), seq_len=256, precision="fp32")
    head = next(x for x in p.layers if x.kind == LayerKind.HEAD)
    assert head.fwd_written_bytes >= 256 * 8192 * 4  # at least the log-softmax's output
    fit = dataclasses.replace(_fit(launch_s=0.0), page_fault_s_per_byte=FAULT_S_PER_BYTE)
    k = CalibratedKernels(fit)
    train = TrainConfig(global_batch=8, seq_len=256, precision=Precision.FP32)

    def forward_s(mbs: int) -> float:
        return traced_layer_s(k, p, train, 1.0, head, 1, 1, mbs, (0.0, 0.0))[0]

    assert 256 * 8192 * 4 * 3 < MMAP_THRESHOLD_BYTES <= 256 * 8192 * 4 * 4
    step = forward_s(4) - forward_s(3) * 4 / 3
    assert step == pytest.approx(head.fwd_written_bytes * 4 * FAULT_S_PER_BYTE, rel=1e-9)
    assert forward_s(2) * 3 / 2 == pytest.approx(forward_s(3), rel=1e-9)  # linear below


def test_the_page_fault_benchmark_measures_fresh_pages() -> None:
    """On this CPU a fresh page costs ~0.4 ns per byte to first touch (loose bounds: a
    shared VM; a zero or negative result would mean the fresh mapping was not fresh)."""
    from paraplan.profiler.microbench_stream import page_fault_s_per_byte
    from paraplan.profiler.microbench_timer import Timer

    seconds = page_fault_s_per_byte(Timer(torch.device("cpu"), 3, group=False))
    assert 1e-11 < seconds < 2e-8


def test_loss_parallel_passes_are_priced_over_the_rank_logits() -> None:
    """torch's loss_parallel adds, over the fused log-softmax, 6 streamed and 2 fresh logits
    tensors and one exp pass forward (5, 2, 1 backward): with a flat 5 GB/s stream, 1 ns per
    fresh byte and exp at 1e9 elements/s, 32 MiB of logits cost exactly that, and 16 MiB the
    same less the faults (under the mmap threshold); exp is no faster than streaming its input
    and output (here the stream bounds it: 2 x 4 bytes per element at 5 GB/s)."""
    from paraplan.planner.cost.calibrated import OpRate
    from paraplan.planner.cost.eager import (
        LOSS_PARALLEL_BWD,
        LOSS_PARALLEL_FWD,
        loss_parallel_extra_s,
    )

    fit = dataclasses.replace(
        _fit(launch_s=0.0),
        page_fault_s_per_byte=FAULT_S_PER_BYTE,
        special_rates=(OpRate(op="aten.exp", elems_per_s=1e9),),
    )
    k = CalibratedKernels(fit)
    for logits in (MMAP_THRESHOLD_BYTES, MMAP_THRESHOLD_BYTES / 2):
        fault = FAULT_S_PER_BYTE if logits >= MMAP_THRESHOLD_BYTES else 0.0
        for passes, streamed in ((LOSS_PARALLEL_FWD, 6), (LOSS_PARALLEL_BWD, 5)):
            exp_s = max(logits / 4 / 1e9, 2 * logits / 5e9)
            want = streamed * logits / 5e9 + 2 * logits * fault + exp_s
            assert loss_parallel_extra_s(k, passes, logits) == pytest.approx(want, rel=1e-12)
