"""Gradient accumulation under FSDP2 as the planner prices it: sharded gradients (ZeRO-2/3)
are reduce-scattered after every micro-batch, so no rank holds the whole model's unsharded
gradients between micro-batches; replicated ones (`replicate`, DDP) are reduced once.

Run as a script (``tests/test_fsdp_grad_sync.py``) it is the one-rank gloo worker: the
process group lives in a child process with a bounded wait, not in the test session."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from paraplan.executor.compose import _grad_sync
from tests.one_rank import child_main, run_child

WIDTH, LAYERS = 256, 4


def _unsharded_grad_bytes(blocks: list[nn.Module]) -> int:
    """Bytes of unsharded gradients FSDP2 holds for `blocks` (accumulated, not reduced)."""
    total = 0
    for block in blocks:
        group = block._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
        for fp in group.fsdp_params:
            unsharded = getattr(fp, "_unsharded_param", None)
            for g in (
                getattr(unsharded, "grad", None),
                getattr(fp, "unsharded_accumulated_grad", None),
            ):
                if g is not None:
                    total += g.numel() * g.element_size()
    return total


def _is_unsharded(block: nn.Module) -> bool:
    """Whether the block's parameters are gathered (unsharded) now."""
    return bool(block._get_fsdp_state()._fsdp_param_group.is_unsharded)  # type: ignore[operator]


def _held_after_a_micro_batch() -> dict[str, int]:
    """Unsharded gradient bytes held after a non-last micro-batch's backward, with the
    executor's `_grad_sync` for sharded and for replicated gradients."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        out: dict[str, int] = {}
        cases = (("sharded", True, False), ("replicated", False, False), ("zero2", True, True))
        for name, sharded, gathered in cases:
            torch.manual_seed(0)
            blocks = [nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
            model = nn.Sequential(*blocks)
            for module in (*blocks, model):  # ZeRO-2: parameters not resharded after forward
                fully_shard(module, mesh=mesh, reshard_after_forward=not gathered)
            for last in (False, True):  # two micro-batches
                with _grad_sync(model, last, sharded, gathered):
                    model(torch.randn(2, WIDTH)).sum().backward()
                if not last:
                    out[name] = _unsharded_grad_bytes(blocks)
                out[f"{name}_gathered_{last}"] = sum(_is_unsharded(b) for b in blocks)
        out |= _sharded_grads_as_backward_runs(mesh)
        return out
    finally:
        dist.destroy_process_group()


def _sharded_grads_as_backward_runs(mesh: object) -> dict[str, int]:
    """One micro-batch under ZeRO-3: bytes of sharded gradients existing as each block's
    backward starts (last block first), and after the backward."""
    torch.manual_seed(0)
    blocks = [nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
    model = nn.Sequential(*blocks)
    for module in (*blocks, model):
        fully_shard(module, mesh=mesh)
    out: dict[str, int] = {}

    def shard_bytes() -> int:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return sum(g.to_local().numel() * g.element_size() for g in grads)  # type: ignore[attr-defined]

    for i, block in enumerate(blocks):
        block.register_full_backward_pre_hook(
            lambda *_, i=i: out.__setitem__(f"at_block_{i}", shard_bytes())
        )
    model(torch.randn(2, WIDTH)).sum().backward()
    out["after_backward"] = shard_bytes()
    return out


def test_sharded_gradients_are_reduced_after_every_micro_batch() -> None:
    held = run_child(__file__)
    grads_bytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4  # fp32
    assert held["sharded"] == held["zero2"] == 0  # reduce-scattered into the shards
    assert held["replicated"] == grads_bytes  # accumulated whole until the last micro-batch
    # ZeRO-2 keeps its parameters gathered between micro-batches, and reshards after the last
    assert held["zero2_gathered_False"] == LAYERS
    assert held["zero2_gathered_True"] == 0
    assert held["sharded_gathered_False"] == held["sharded_gathered_True"] == 0


def test_one_micro_batch_makes_its_sharded_gradients_as_backward_runs() -> None:
    """`Evaluator.single_pass` for ZeRO-3: a unit's sharded gradient exists once its backward
    and reduce-scatter are done, so at the peak (the backward's start, every activation
    still held) no gradient exists yet; they grow block by block (from the last)."""
    held = run_child(__file__)
    block_bytes = (WIDTH * WIDTH + WIDTH) * 4  # fp32, one rank: the shard is the whole
    assert held["at_block_3"] == 0
    for i in range(LAYERS):
        assert held[f"at_block_{i}"] <= (LAYERS - 1 - i) * block_bytes
    assert held["after_backward"] == LAYERS * block_bytes


if __name__ == "__main__":
    child_main(_held_after_a_micro_batch)
