"""ZeRO-2/3 beside a pipeline hold ZeRO-1's parameters and gradients (`memory.held_zero_stage`):
torch's pipelining defers FSDP2's gradient reduction and resharding to the step's end. The
torch behaviour is checked in its source (a canary for a torch upgrade); the planner's memory
is checked against ZeRO-1's and, without a pipeline, against the sharded hand count."""

from __future__ import annotations

import inspect

import pytest
from torch.distributed.pipelining.stage import _PipelineStageBase

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model_parse import parse_model
from paraplan.planner.strategy import Schedule, Strategy


def test_torch_pipelining_defers_fsdp_reduction_and_resharding() -> None:
    """What `held_zero_stage` rests on: every backward but the last runs with FSDP2's
    gradient sync and reshard-after-backward off; the reduction runs once at the end."""
    nosync = inspect.getsource(_PipelineStageBase.backward_maybe_with_nosync)
    assert "set_requires_gradient_sync(False)" in nosync
    assert "set_reshard_after_backward(False)" in nosync
    reduce = inspect.getsource(_PipelineStageBase.perform_reduce_grad)
    assert "set_requires_gradient_sync(True)" in reduce


@pytest.fixture(scope="module")
def ev() -> Evaluator:
    profile = parse_model("gpt2").to_profile(seq_len=512)
    return Evaluator(
        profile, parse_cluster("8xa100-80gb"), TrainConfig(global_batch=32, seq_len=512)
    )


def _states(ev: Evaluator, s: Strategy) -> tuple[float, float, float]:
    mem, _ = ev.memory(s)
    return mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes


@pytest.mark.parametrize("zero", [2, 3])
def test_beside_a_pipeline_zero_2_and_3_hold_zero_1s_states(ev: Evaluator, zero: int) -> None:
    pp = dict(dp=4, tp=1, pp=2, micro_batch_size=1, schedule=Schedule.ONE_F_ONE_B)
    assert _states(ev, Strategy(zero_stage=zero, **pp)) == _states(ev, Strategy(zero_stage=1, **pp))


def test_without_a_pipeline_zero_3_shards_parameters_and_gradients(ev: Evaluator) -> None:
    """Hand count: GPT-2's parameters over 8 ranks, bf16 working copy, fp32 gradients."""
    params = sum(x.params for x in ev.stage_model.profile.layers)
    p3, g3, _ = _states(ev, Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, zero_stage=3))
    assert p3 == pytest.approx(params * 2 / 8)
    assert g3 == pytest.approx(params * 4 / 8)
