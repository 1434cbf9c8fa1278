"""Model states per parameter against the published tables: ZeRO's (Rajbhandari et al. 2019,
16-bit gradients) and Megatron Core's distributed optimizer (fp32 main gradients, the default
runtime). Expected values are the papers' figures, never taken from the code under test."""

from __future__ import annotations

import pytest

from paraplan.planner.config import Runtime, TrainConfig
from paraplan.planner.cost.memory import model_state_bytes

GB = 1e9  # ZeRO's Figure 1 prints decimal gigabytes

# --- ZeRO model states (Rajbhandari et al. 2019, Figure 1) -----------------------------------

ZERO_PSI = 7.5e9  # parameters
ZERO_ND = 64  # data-parallel degree
# Mixed-precision Adam: 2 bytes of fp16 params + 2 of grads + K = 12 of optimizer states.
ZERO_FIGURE_1_GB = {0: 120.0, 1: 31.41, 2: 16.64, 3: 1.875}


def _mixed_adam() -> TrainConfig:
    """The ZeRO paper's accounting: gradients in the working 16-bit precision."""
    return TrainConfig(
        global_batch=1,
        seq_len=1,
        precision="bf16",
        optimizer="adamw",
        runtime=Runtime(fp32_grads=False),
    )


@pytest.mark.parametrize(("stage", "per_param"), [(0, 18.0), (1, 6.0 + 12.0 / ZERO_ND)])
def test_megatron_distributed_optimizer_bytes_per_parameter(stage, per_param):
    """Megatron Core's distributed-optimizer guide: "bf16 parameters, fp32 gradients" take 18
    bytes per parameter, 6 + 12/d with the distributed optimizer (ZeRO-1), the default runtime's
    accounting (fp32 main gradients)."""
    train = TrainConfig(global_batch=1, seq_len=1, precision="bf16", optimizer="adamw")
    parts = model_state_bytes(ZERO_PSI, shard_ranks=ZERO_ND, zero_stage=stage, train=train)
    assert sum(parts) / ZERO_PSI == pytest.approx(per_param, rel=1e-12)


@pytest.mark.parametrize(("stage", "expected_gb"), ZERO_FIGURE_1_GB.items())
def test_zero_figure_1_model_states(stage, expected_gb):
    parts = model_state_bytes(ZERO_PSI, shard_ranks=ZERO_ND, zero_stage=stage, train=_mixed_adam())
    total = sum(parts)
    if stage in (1, 2):  # the figure rounds these two
        assert total / GB == pytest.approx(expected_gb, rel=1e-3)
    else:
        assert total / GB == expected_gb


def test_zero_stages_shard_states_grads_then_params():
    # §5: P_os shards the 12-byte optimizer states, P_g also the 2-byte grads, P_p the params.
    psi, nd = ZERO_PSI, ZERO_ND
    expected = {
        0: (2 * psi, 2 * psi, 12 * psi),
        1: (2 * psi, 2 * psi, 12 * psi / nd),
        2: (2 * psi, 2 * psi / nd, 12 * psi / nd),
        3: (2 * psi / nd, 2 * psi / nd, 12 * psi / nd),
    }
    for stage, parts in expected.items():
        got = model_state_bytes(psi, shard_ranks=nd, zero_stage=stage, train=_mixed_adam())
        assert got == pytest.approx(parts, rel=1e-12), stage


def test_zero_offload_moves_the_optimizer_states_off_the_gpu():
    params, grads, optimizer = model_state_bytes(
        ZERO_PSI, shard_ranks=ZERO_ND, zero_stage=2, train=_mixed_adam(), offload_optimizer=True
    )
    assert optimizer == 0.0
    assert (params, grads) == pytest.approx((2 * ZERO_PSI, 2 * ZERO_PSI / ZERO_ND), rel=1e-12)


def test_fp32_sgd_model_states():
    # fp32 training keeps no master copy: 4 bytes params + 4 grads + 4 momentum.
    train = TrainConfig(global_batch=1, seq_len=1, precision="fp32", optimizer="sgd")
    parts = model_state_bytes(1e9, shard_ranks=8, zero_stage=0, train=train)
    assert parts == pytest.approx((4e9, 4e9, 4e9), rel=1e-12)


def test_zero_stage_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="zero_stage=4"):
        model_state_bytes(1e9, shard_ranks=8, zero_stage=4, train=_mixed_adam())
