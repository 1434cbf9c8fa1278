"""The executor's data-parallel wrapper (`executor/data_parallel.data_parallel_kind`) follows
the planner's one rule for FSDP2 (`Strategy.fsdp_wrapped`), which its capabilities table and
DTensor-optimizer price also read."""

from __future__ import annotations

import pytest

import paraplan
from paraplan.executor.data_parallel import DataParallelKind, data_parallel_kind

CASES = {
    "dp=8,tp=1,pp=1,zero=0": DataParallelKind.DDP,
    "dp=8,tp=1,pp=1,zero=1": DataParallelKind.DDP,
    "dp=8,tp=1,pp=1,zero=3": DataParallelKind.FSDP,
    "dp=4,tp=2,pp=1,zero=1": DataParallelKind.REPLICATE,
    "dp=4,tp=1,pp=2,zero=1": DataParallelKind.REPLICATE,
    "dp=2,tp=4,pp=1,zero=0": DataParallelKind.REPLICATE,
    "dp=1,tp=4,pp=2,zero=0": DataParallelKind.NONE,
    "dp=8,tp=1,pp=1,zero=2,offload_optimizer=true": DataParallelKind.FSDP,
    "dp=1,tp=4,pp=2,zero=2,offload_optimizer=true": DataParallelKind.FSDP,
}


@pytest.mark.parametrize("fix", sorted(CASES))
def test_kind_matches_the_planner_rule(fix: str) -> None:
    plan = paraplan.plan("gpt2", "8xa100-80gb", global_batch=64, seq_len=512, fix=fix).plan
    kind = data_parallel_kind(plan)
    assert kind == CASES[fix], plan.short()
    assert (kind == DataParallelKind.FSDP) == plan.strategy().fsdp_wrapped
