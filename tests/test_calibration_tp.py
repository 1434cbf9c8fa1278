"""Tensor parallelism's measured host cost per block (`planner/calibration_tp.py`) and how the
eager cost model reads it (`cost/eager.tensor_parallel_host_s`)."""

from __future__ import annotations

import pytest

from paraplan.planner.calibration_tp import TensorParallelBlock, TensorParallelDispatch


def _block(gated: bool, sp: bool, f: float, b: float) -> TensorParallelBlock:
    return TensorParallelBlock(gated=gated, sequence_parallel=sp, fwd_s=f, bwd_s=b)


def test_block_s_reads_the_kind_measured_else_the_same_mlp_else_any() -> None:
    td = TensorParallelDispatch(
        blocks=(
            _block(False, False, 1.0, 2.0),
            _block(False, True, 3.0, 4.0),
            _block(True, True, 5.0, 6.0),
        )
    )
    assert td.block_s(gated=False, sequence_parallel=True) == (3.0, 4.0)
    assert td.block_s(gated=False, sequence_parallel=False) == (1.0, 2.0)
    assert td.block_s(gated=True, sequence_parallel=True) == (5.0, 6.0)
    # gated without SP was not measured: the gated block (same MLP) stands in
    assert td.block_s(gated=True, sequence_parallel=False) == (5.0, 6.0)
    only = TensorParallelDispatch(blocks=(_block(True, False, 7.0, 8.0),))
    assert only.block_s(gated=False, sequence_parallel=True) == (7.0, 8.0)


def test_kinds_must_be_distinct_and_seconds_nonnegative() -> None:
    with pytest.raises(ValueError, match="each"):
        TensorParallelDispatch(blocks=())
    with pytest.raises(ValueError, match="each"):
        TensorParallelDispatch(blocks=(_block(True, True, 1, 1), _block(True, True, 2, 2)))
    with pytest.raises(ValueError, match="bwd_s"):
        _block(True, True, 1.0, -1.0)


def test_eager_prices_a_gpt2_block_from_the_plain_kind_and_skips_other_layers() -> None:
    from paraplan.api import model_profile
    from paraplan.planner.cost.calibrated import CalibratedKernels
    from paraplan.planner.cost.eager import tensor_parallel_host_s
    from paraplan.planner.model import LayerKind

    from .test_calibration import _fit

    p = model_profile("gpt2", seq_len=128, precision="fp32", source="spec")
    td = TensorParallelDispatch(
        blocks=(_block(False, True, 1e-3, 2e-3), _block(True, True, 5e-3, 6e-3))
    )
    k = CalibratedKernels(_fit(), time_scale=2.0)
    block = next(x for x in p.layers if x.kind == LayerKind.BLOCK)
    head = p.layers[-1]
    assert tensor_parallel_host_s(k, p, block, 2, td) == pytest.approx((2e-3, 4e-3))
    assert tensor_parallel_host_s(k, p, block, 1, td) == (0.0, 0.0)
    assert tensor_parallel_host_s(k, p, head, 2, td) == (0.0, 0.0)
    assert tensor_parallel_host_s(k, p, block, 2, None) == (0.0, 0.0)


def test_eager_prices_a_llama_block_from_the_gated_kind() -> None:
    from paraplan.api import model_profile
    from paraplan.planner.cost.calibrated import CalibratedKernels
    from paraplan.planner.cost.eager import tensor_parallel_host_s
    from paraplan.planner.model import LayerKind

    from .test_calibration import _fit

    p = model_profile("llama3-8b", seq_len=128, precision="fp32", source="spec")
    td = TensorParallelDispatch(
        blocks=(_block(False, True, 1e-3, 2e-3), _block(True, True, 5e-3, 6e-3))
    )
    block = next(x for x in p.layers if x.kind == LayerKind.BLOCK)
    got = tensor_parallel_host_s(CalibratedKernels(_fit()), p, block, 4, td)
    assert got == pytest.approx((5e-3, 6e-3))


def test_gemm_kernel_cache_counts_distinct_shapes_not_depth() -> None:
    import dataclasses

    from paraplan.api import model_profile
    from paraplan.planner.cost.kernel_cache import gemm_kernel_cache_bytes
    from paraplan.planner.model import LayerKind

    from .test_calibration import _fit

    fit = dataclasses.replace(_fit(), gemm_cache_init_bytes=1000.0, gemm_shape_bytes=10.0)
    p = model_profile("gpt2", seq_len=128, precision="bf16", source="spec")
    blocks = [x for x in p.layers if x.kind == LayerKind.BLOCK]
    head = [x for x in p.layers if x.kind == LayerKind.HEAD]
    # a GPT-2 block: qkv, attention output, up, down: 4 shapes, 3 GEMMs each
    one = gemm_kernel_cache_bytes(p, blocks[:1], 1, fit)
    assert one == 1000.0 + 4 * 3 * 10.0
    assert gemm_kernel_cache_bytes(p, blocks, 1, fit) == one  # 12 identical blocks
    # the head adds its one matmul; the embedding (a gather) none
    assert gemm_kernel_cache_bytes(p, p.layers, 1, fit) == one + 3 * 10.0
    assert gemm_kernel_cache_bytes(p, head, 1, fit) == 1000.0 + 3 * 10.0
    assert gemm_kernel_cache_bytes(p, blocks, 1, None) == 0.0
    assert gemm_kernel_cache_bytes(p, blocks, 1, _fit()) == 0.0  # not measured


def test_a_calibrated_stage_holds_its_gemm_kernels_in_other_bytes() -> None:
    """The stage model adds the kernel cache to each stage's other bytes on a calibrated
    cluster: the one-time cost plus three kernels per distinct matmul shape of the stage."""
    import dataclasses

    from paraplan.api import model_profile
    from paraplan.planner.calibration import DtypeKernels
    from paraplan.planner.cluster import cluster_from_dict
    from paraplan.planner.config import Precision, TrainConfig
    from paraplan.planner.cost.stages import StageModel
    from paraplan.planner.strategy import Strategy

    from .test_calibration import _calibration, _cluster_dict, _fit

    p = model_profile("gpt2", seq_len=128, precision="fp32", source="spec")
    train = TrainConfig(global_batch=8, seq_len=128, precision=Precision.FP32)
    plain = _calibration()
    cached = dataclasses.replace(
        plain,
        dtype_kernels=(
            DtypeKernels(
                dtype="fp32",
                fit=dataclasses.replace(_fit(), gemm_cache_init_bytes=1e6, gemm_shape_bytes=5e5),
            ),
        ),
    )
    s = Strategy(dp=2, tp=1, pp=1, cp=1, micro_batch_size=1)
    others = []
    for cal in (plain, cached):
        sm = StageModel(p, cluster_from_dict(_cluster_dict(cal)), train)
        (stage,) = sm.stages(sm.layout_of(s))
        others.append(sm.static_memory(stage, 1, 1, 2, 0, False).other_bytes)
    # GPT-2: four block shapes and the head's: 5 x 3 kernels
    assert others[1] - others[0] == pytest.approx(1e6 + 15 * 5e5)
