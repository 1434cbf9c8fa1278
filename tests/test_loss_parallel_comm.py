"""The vocabulary-parallel loss's collectives (`cost/stage_core.py`, `LOSS_ALL_REDUCES`), counted
on torch's own `loss_parallel` over two gloo ranks, and what the cost model adds for them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest


def _loss_worker(rank: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    calls: list[str] = []

    def counting(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kw: Any) -> Any:
            calls.append(name)
            return fn(*args, **kw)

        return counted

    for name in dir(funcol):  # torch's loss and DTensor's placements call them through funcol
        if name.startswith(("all_", "reduce_scatter", "broadcast")):
            setattr(funcol, name, counting(name, getattr(funcol, name)))

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        tokens, vocab = 12, 32
        full = torch.randn(tokens, vocab)
        target = torch.randint(0, vocab, (tokens,))
        local = full.chunk(2, dim=-1)[rank].clone().requires_grad_()
        logits = DTensor.from_local(local, mesh, [Shard(-1)])
        with loss_parallel():
            loss = F.cross_entropy(logits, target)
            fwd = list(calls)
            calls.clear()
            loss.backward()
        bwd = list(calls)
        reference = F.cross_entropy(full, target)
        out.put((rank, fwd, bwd, float(loss.detach().full_tensor()), float(reference)))
    finally:
        dist.destroy_process_group()


def test_loss_parallel_all_reduces_its_forward_only() -> None:
    """torch's `loss_parallel` cross-entropy over vocabulary-sharded logits on two ranks runs
    `LOSS_ALL_REDUCES` all-reduces in forward and no collective in backward, and its loss is
    the single-process loss over the whole vocabulary."""
    import torch.multiprocessing as mp

    from paraplan.planner.cost.stage_core import LOSS_ALL_REDUCES
    from tests.executor_helpers import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(
        _loss_worker, args=(free_port(), out), nprocs=2, join=True, start_method="spawn"
    )
    for _, fwd, bwd, loss, reference in sorted(out.get(timeout=120) for _ in range(2)):
        assert fwd == ["all_reduce"] * LOSS_ALL_REDUCES
        assert bwd == []
        assert loss == pytest.approx(reference, rel=1e-5)


def test_the_head_stage_pays_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under TP the stage with the head pays the loss's all-reduces of one fp32 value per
    token on the TP group each micro-batch, on top of what the same plan paid without them;
    a plan without TP pays none."""
    from paraplan.planner.cluster import parse_cluster
    from paraplan.planner.config import TrainConfig
    from paraplan.planner.cost import stage_core
    from paraplan.planner.cost.comm import AxisLink, Collectives
    from paraplan.planner.cost.evaluate import Evaluator
    from paraplan.planner.model_parse import parse_model
    from paraplan.planner.strategy import Recompute, Strategy

    seq = 1024
    profile = parse_model("gpt:layers=4,hidden=1024,heads=16,vocab=50304,seq=1024").to_profile(
        seq_len=seq
    )
    cluster = parse_cluster("8xh100")
    train = TrainConfig(global_batch=16, seq_len=seq)
    s = Strategy(dp=4, tp=2, pp=1, sequence_parallel=True, micro_batch_size=2,
                 recompute=Recompute.NONE)  # fmt: skip
    plain = dataclasses.replace(s, dp=8, tp=1, sequence_parallel=False)

    def comm_s(strategy: Strategy) -> float:
        return Evaluator(profile, cluster, train).evaluate(strategy).time.comm_s

    priced, priced_plain = comm_s(s), comm_s(plain)
    monkeypatch.setattr(stage_core, "LOSS_ALL_REDUCES", 0)
    without, without_plain = comm_s(s), comm_s(plain)
    monkeypatch.undo()
    one = Collectives(cluster.accelerator).all_reduce(2 * seq * 4.0, AxisLink(2, 2, 1))
    microbatches = 16 // (4 * 2)
    assert priced - without == pytest.approx(
        stage_core.LOSS_ALL_REDUCES * one * microbatches, rel=1e-9
    )
    assert priced_plain == without_plain
