"""Tensor parallelism's and FSDP2's host cost on the ranks' mesh (`paraplan calibrate`, more
than one rank): DTensor operators cost sharding propagation in Python on top of their kernel."""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import parallelize_module

from ..planner.calibration_tp import TensorParallelBlock, TensorParallelDispatch
from .microbench import Budget
from .microbench_timer import Timer

TP_HEAD_DIM = 16
"""Head size of the tensor-parallel benchmark blocks (two heads per rank)."""
TP_TOKENS_PER_RANK = 8
"""Sequence positions per rank: small, so the kernels are cheap beside the host work."""
TP_REPEATS = 9
"""Timed calls per measurement (thread CPU time jitters less than wall time, but a block's
forward is only a few milliseconds)."""


TP_ROUNDS = 7
"""Alternations of the plain and the wrapped block; the median difference is kept. The
wrapped block's backward varies a lot from one measurement to the next in the calling
thread's CPU time (one SP block, each a median of 9 calls, quiet machine, 2026-11-25: 4.3 to
11.2 ms over 9 alternations; the difference of the fastest rounds moved more than the
median). One measurement gave 4.1 ms in one calibration and 9.4 ms in the next, the median of
3 alternations 4.8 and 9.4 ms, the median of 9 alternations 5.1-5.8 ms in four trials."""


def tensor_parallel_dispatch(
    timer: Timer, budget: Budget | None = None, between: Callable[[], None] = lambda: None
) -> TensorParallelDispatch:
    """DTensor's host cost on the default group as a 1-D mesh: for a plain (GPT-2) and a gated
    (Llama) block of the executor, with and without sequence parallelism, the calling thread's
    CPU seconds of the block wrapped by the executor's TP plan less the same block unwrapped,
    forward and backward (`calibration_tp`). The collectives' waiting is not in the calling
    thread's CPU time; the links price it. `between` runs before each block's and the loss's
    rounds (every rank: the dispatch samples that set the part's speed)."""
    rounds, repeats = _knobs(budget, TP_ROUNDS)
    dev = timer.device
    world = dist.get_world_size()
    mesh = init_device_mesh(dev.type, (world,))
    blocks = []
    for gated in (False, True):
        for sp in (False, True):
            plain, _, hidden = _executor_block(gated, world, dev)
            wrapped, plan_fn, _ = _executor_block(gated, world, dev)
            parallelize_module(wrapped, mesh, plan_fn(sp))
            if sp and hasattr(wrapped, "seq_shards"):
                cast(Any, wrapped).seq_shards = world  # as executor.tensor_parallel.apply_tp
            tokens = TP_TOKENS_PER_RANK * world
            x = torch.randn(1, tokens, hidden, device=dev, requires_grad=True)
            local = torch.randn(1, tokens // world if sp else tokens, hidden, device=dev)
            local.requires_grad_()
            fwd, bwd = [], []
            for _ in range(rounds):  # alternated: a neighbour's burst hits one round
                between()
                f0, t0 = _thread_s(timer, plain, x, repeats)
                f1, t1 = _thread_s(timer, wrapped, local, repeats)
                fwd.append(f1 - f0)
                bwd.append((t1 - f1) - (t0 - f0))
            blocks.append(
                TensorParallelBlock(
                    gated=gated,
                    sequence_parallel=sp,
                    fwd_s=max(0.0, statistics.median(fwd)),
                    bwd_s=max(0.0, statistics.median(bwd)),
                )
            )
    between()
    loss_f, loss_b = _loss_parallel_s(timer, mesh, rounds, repeats)
    return TensorParallelDispatch(blocks=tuple(blocks), loss_fwd_s=loss_f, loss_bwd_s=loss_b)


TP_LOSS_VOCAB = 64
"""Vocabulary of each rank's logits shard in the loss benchmark (small: the host work shows)."""


def _loss_parallel_s(timer: Timer, mesh: Any, rounds: int, repeats: int) -> tuple[float, float]:
    """(forward, backward) CPU seconds of the calling thread torch's vocabulary-parallel
    cross-entropy (`loss_parallel`, as the executor runs it over vocabulary-sharded logits)
    adds over the plain loss on the same shard: `TP_TOKENS_PER_RANK` tokens, medians of
    alternations as for the blocks. Waiting on its all-reduces is left out (the links price
    them, `cost/stage_core.py`)."""
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import loss_parallel

    dev, world = timer.device, dist.get_world_size()
    tokens = TP_TOKENS_PER_RANK * world
    local = torch.randn(tokens, TP_LOSS_VOCAB, device=dev, requires_grad=True)
    target = torch.randint(0, TP_LOSS_VOCAB * world, (tokens,), device=dev)
    shard_target = target % TP_LOSS_VOCAB

    def sharded(backward: bool) -> None:
        logits = DTensor.from_local(local, mesh, [Shard(-1)])
        with loss_parallel():
            loss = F.cross_entropy(logits, target)
            if backward:
                loss.backward()

    def plain(backward: bool) -> None:
        loss = F.cross_entropy(local, shard_target)
        if backward:
            loss.backward()

    def clocked(fn: Any, backward: bool) -> float:
        return timer(lambda: fn(backward), repeats, clock=time.thread_time)

    fwd, bwd = [], []
    for _ in range(rounds):
        f0, t0 = clocked(plain, False), clocked(plain, True)
        f1, t1 = clocked(sharded, False), clocked(sharded, True)
        fwd.append(f1 - f0)
        bwd.append((t1 - f1) - (t0 - f0))
    return max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd))


def _executor_block(gated: bool, world: int, dev: torch.device) -> tuple[nn.Module, Any, int]:
    """(block, its TP plan function, hidden size) of the executor's Llama (gated) or GPT-2
    chain, built from a one-layer Hugging Face model with two heads per rank. The executor is
    imported here, when a calibration runs (the profiler does not import it otherwise)."""
    import transformers

    heads = 2 * world
    hidden = TP_HEAD_DIM * heads
    if gated:
        cfg = transformers.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            vocab_size=64,
            max_position_embeddings=64,
        )
        cfg._attn_implementation = "sdpa"  # what the executor requires (no mask)
        models = importlib.import_module("paraplan.executor.models.llama")
        chain = models.llama_chain_module(transformers.LlamaForCausalLM(cfg))
        plan_fn = models.llama_tp_plan
    else:
        gcfg = transformers.GPT2Config(
            n_layer=1,
            n_embd=hidden,
            n_head=heads,
            vocab_size=64,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        models = importlib.import_module("paraplan.executor.models.gpt2")
        chain = models.gpt2_chain_module(transformers.GPT2LMHeadModel(gcfg))
        plan_fn = models.gpt2_tp_plan
    block = next(iter(chain.blocks.values())).to(dev)
    return block, plan_fn, hidden


def _knobs(budget: Budget | None, rounds: int) -> tuple[int, int]:
    """(alternations, timed calls per measurement): a budget's (`--quick`'s fewer) or
    `rounds` and `TP_REPEATS`."""
    if budget is None:
        return rounds, TP_REPEATS
    return budget.runtime_rounds or rounds, budget.runtime_repeats or TP_REPEATS


def _thread_s(timer: Timer, block: nn.Module, x: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(forward, forward + backward) median CPU seconds of the calling thread."""

    def forward() -> None:
        block(x)

    def train() -> None:
        block(x).sum().backward()

    return (
        timer(forward, repeats, clock=time.thread_time),
        timer(train, repeats, clock=time.thread_time),
    )


FSDP_UNITS = 4
"""Units of the FSDP2 host-cost benchmark (the slope from 1 to this many)."""
FSDP_WIDTH = 16
"""Width of each benchmark Linear (width x width, with bias: two parameter tensors)."""
FSDP_LINEARS = 8
"""Linears per unit in the second stack, whose slope over the first gives the per-tensor
part: FSDP2 handles every parameter of a unit on its own (views of the gathered buffer,
the sharded gradient made a DTensor, hooks), 50 us per tensor on this VM (2026-11-26: 1.41,
1.54 and 1.91 ms per unit of 2, 6 and 12 tensors), so a 12-tensor GPT-2 block costs ~0.5 ms
more per micro-batch than a one-Linear unit). Eight, not four (2026-11-26, 18:40): with 24
extra tensors the slope read 0 once under load (a failed closed-loop test) and 53-153 us in
three quiet calibrations, with 56 extra tensors 77-96 us, for ~0.1 s more."""
FSDP_ROUNDS = 5
"""Alternations of the stacks (the median slopes are kept)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FsdpUnitCost:
    """Host seconds FSDP2 adds per unit and micro-batch beyond its collectives."""

    unit_s: float
    """Fixed per unit."""
    tensor_s: float
    """Per parameter tensor of the unit."""

    def at_speed(self, ratio: float) -> FsdpUnitCost:
        """Both figures scaled by `ratio` (`microbench_dispatch.DispatchSampler.speed_ratio`)."""
        return FsdpUnitCost(unit_s=self.unit_s * ratio, tensor_s=self.tensor_s * ratio)


NO_FSDP = FsdpUnitCost(unit_s=0.0, tensor_s=0.0)
"""Nothing measured (one rank)."""


def fsdp_unit_cost(
    timer: Timer,
    width: int = FSDP_WIDTH,
    budget: Budget | None = None,
    between: Callable[[], None] = lambda: None,
) -> FsdpUnitCost:
    """Host seconds one FSDP2 unit adds to a forward+backward on the ranks' mesh, in the
    calling thread's CPU time (its pre/post hooks, copy-in and copy-out, the gradient
    division), so that waiting on the unit's collectives (priced by the links) is left out:
    the slope of stacks of `fully_shard` units from 1 to `FSDP_UNITS` units of one Linear
    (per unit), and from units of one Linear to units of `FSDP_LINEARS` (per tensor), each
    less the same stacks unwrapped (their kernels). Medians of `FSDP_ROUNDS` alternations:
    the wall-clock slope this replaced measured 0.4-7.5 ms across calibrations of this VM.
    `between` runs before each round (every rank)."""
    from torch.distributed.fsdp import fully_shard

    dev = timer.device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    x = torch.randn(4, width, device=dev)
    shapes = ((1, 1), (FSDP_UNITS, 1), (FSDP_UNITS, FSDP_LINEARS))  # (units, Linears each)
    steps = []
    for units, linears in shapes:
        for wrap in (True, False):
            stack = nn.Sequential(
                *(
                    nn.Sequential(*(nn.Linear(width, width, device=dev) for _ in range(linears)))
                    for _ in range(units)
                )
            )
            if wrap:
                for unit in stack:
                    fully_shard(unit, mesh=mesh)
                fully_shard(stack, mesh=mesh)

            def step(stack: nn.Module = stack) -> None:
                stack(x).sum().backward()

            steps.append(step)
    per_unit, per_tensor = [], []
    rounds, repeats = _knobs(budget, FSDP_ROUNDS)
    for _ in range(rounds):
        between()
        t = [timer(step, repeats, clock=time.thread_time) for step in steps]
        one, many, wide = (t[i] - t[i + 1] for i in (0, 2, 4))  # wrapped less unwrapped
        per_unit.append((many - one) / (FSDP_UNITS - 1))
        per_tensor.append((wide - many) / (FSDP_UNITS * 2 * (FSDP_LINEARS - 1)))
    tensor_s = max(0.0, statistics.median(per_tensor))
    return FsdpUnitCost(
        unit_s=max(0.0, statistics.median(per_unit) - 2 * tensor_s), tensor_s=tensor_s
    )


ADAMW_TENSORS = 16
"""Parameter tensors of the DTensor optimizer benchmark."""
ADAMW_ROUNDS = 3
"""Alternations of the plain and the DTensor step: one of each measured 136-399 us per tensor
across calibrations of this VM (2026-11-25)."""


def dtensor_adamw_tensor_s(
    timer: Timer, numel: int = 256, between: Callable[[], None] = lambda: None
) -> float:
    """Seconds an AdamW step (torch's single-tensor loop, the CPU default) spends per
    parameter tensor beyond a plain tensor's when the parameters are DTensors (FSDP2's
    `Shard(0)` shards; TP's are alike): every operator of the update runs DTensor's dispatch
    first. Measured as the difference of two steps over `ADAMW_TENSORS` tensors of `numel`
    local elements, DTensor against plain, so the kernels cancel. `between` runs before each
    round (every rank)."""
    dev = timer.device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))

    def params(dtensor: bool) -> list[nn.Parameter]:
        out = []
        for _ in range(ADAMW_TENSORS):
            local = torch.randn(numel, device=dev)
            value = DTensor.from_local(local, mesh, [Shard(0)]) if dtensor else local
            p = nn.Parameter(value)
            p.grad = torch.ones_like(p)
            out.append(p)
        return out

    steps = [torch.optim.AdamW(params(dt), lr=1e-3, foreach=False).step for dt in (False, True)]
    extra = []
    for _ in range(ADAMW_ROUNDS):  # alternated: the median difference is kept
        between()
        plain_s, dtensor_s = (timer(step) for step in steps)
        extra.append((dtensor_s - plain_s) / ADAMW_TENSORS)
    return max(0.0, statistics.median(extra))
