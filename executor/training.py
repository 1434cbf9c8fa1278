"""Training under a plan: one step, the reported loss, and a timed loop on synthetic tokens
with checkpoints and the run report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..planner.strategy import MeshAxis
from ..profiler.host_memory import HostPeak, TensorPeakTracker, peak_resident_bytes
from ..profiler.host_probe import RUN_SAMPLES, HostProbe
from . import mesh as meshes
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .compose import ParallelModel
from .data import synthetic_tokens
from .optim import Optimizers
from .report import RunReport, make_report, peak_memory_bytes


def global_loss(pm: ParallelModel, loss: torch.Tensor | None) -> float:
    """The step's loss over the global batch, on every rank: the mean of the data-parallel
    replicas' losses (held by the last pipeline stage, the same on each TP rank; each CP rank
    holds the mean over its equal share of the tokens). One all-reduce over the world."""
    held = loss.detach().float() if loss is not None else torch.zeros((), device=pm.device)
    total = held.reshape(1).clone()
    dist.all_reduce(total)
    holders = 1  # ranks of the last stage: each dp replica's loss, on each tp and cp rank
    for axis in (MeshAxis.DP, MeshAxis.TP, MeshAxis.CP):
        holders *= meshes.axis_size(pm.mesh, axis)
    return total.item() / holders


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """How long to train and where to keep checkpoints."""

    steps: int
    """Optimizer steps in total (a resumed run continues to this count)."""
    warmup_steps: int = 2
    """Steps left out of the timing (allocations, first collectives, shape inference); fewer
    when a resumed run has no more steps left, so that at least one step is timed."""
    lr: float = 1e-3
    """Learning rate (constant)."""
    data_seed: int = 0
    """Seed of the synthetic batches (batch k depends on the seed and k only)."""
    checkpoint_dir: str | None = None
    """Folder for DCP checkpoints (None: none)."""
    save_every: int = 0
    """Save after every this many steps (0: never)."""
    resume: bool = False
    """Continue from the newest checkpoint in `checkpoint_dir`, when there is one."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup_steps < 0 or self.save_every < 0:
            raise ValueError(
                f"steps={self.steps}, warmup_steps={self.warmup_steps}, save_every="
                f"{self.save_every}: steps must be >= 1 and the others >= 0"
            )
        if (self.save_every or self.resume) and not self.checkpoint_dir:
            raise ValueError("save_every/resume need checkpoint_dir: pass a folder")


def train_step(
    pm: ParallelModel, opts: Optimizers, input_ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor | None:
    """One optimizer step on this replica's batch (B, T); the loss as `forward_backward`."""
    opts.zero_grad()
    loss = pm.forward_backward(input_ids, labels)
    opts.step()
    return loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(
    pm: ParallelModel, options: RunOptions, on_step: Callable[[int, float], None] | None = None
) -> RunReport:
    """Train on synthetic tokens for `options.steps` steps (resuming when asked), time each
    step, and return the run report (times from this rank's clock, memory of every rank).
    `on_step(step, loss)` runs after each step."""
    plan = pm.plan
    opts = Optimizers(pm, lr=options.lr)
    first = 0
    if options.resume and options.checkpoint_dir:
        latest = latest_checkpoint(options.checkpoint_dir)
        if latest is not None:
            first = load_checkpoint(pm, opts, latest)
    if first >= options.steps:
        raise ValueError(
            f"the checkpoint in {options.checkpoint_dir!r} is at step {first} and the run asks "
            f"for {options.steps} steps: nothing to do; ask for more steps"
        )
    if options.checkpoint_dir:
        Path(options.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    if pm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(pm.device)
    # A CPU run measures its memory on the last step, profiled and so not timed, when that
    # leaves a step to time (profiler.host_memory: peak RSS counts glibc's retained heap).
    memory_step = (
        options.steps - 1
        if pm.device.type == "cpu" and options.steps - first >= options.warmup_steps + 2
        else None
    )
    host: HostPeak | None = None
    times, losses = [], []
    # a CPU run times the calibration's host workload after its warm-up and after its last
    # step, every rank at once as in the calibration: how fast the machine was meanwhile
    probe = HostProbe() if pm.device.type == "cpu" else None
    probe_at = first + min(options.warmup_steps, options.steps - first - 1)
    probe_s: list[float] = []
    for step in range(first, options.steps):
        if probe is not None and step == probe_at:
            probe_s += [probe.sample_s() for _ in range(RUN_SAMPLES)]
        x, y = synthetic_tokens(
            plan.train.global_batch,
            plan.train.seq_len,
            plan.model.vocab,
            seed=options.data_seed,
            step=step,
        )
        x, y = pm.local_batch(x), pm.local_batch(y)
        if step == memory_step:
            opts.zero_grad()  # the last step's gradients are gone before the count starts
            with TensorPeakTracker() as tracker:
                loss = train_step(pm, opts, x, y)
            host = tracker.result()
        else:
            _sync(pm.device)
            start = time.perf_counter()
            loss = train_step(pm, opts, x, y)
            _sync(pm.device)
            times.append(time.perf_counter() - start)
        losses.append(global_loss(pm, loss))
        if options.save_every and (step + 1) % options.save_every == 0:
            save_checkpoint(pm, opts, options.checkpoint_dir or "", step=step + 1)
        if on_step is not None:
            on_step(step, losses[-1])
    if probe is not None:
        probe_s += [probe.sample_s() for _ in range(RUN_SAMPLES)]
    memory, source = peak_memory_bytes(pm.device, host)
    gathered: list[tuple[float, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (memory, float(peak_resident_bytes())))
    pairs = [g or (0.0, 0.0) for g in gathered]
    warm = min(options.warmup_steps, max(len(times) - 1, 0))  # a short resumed run: time some
    return make_report(
        plan,
        step_times_s=times[warm:],
        warmup_steps=warm,
        memory_bytes=[float(m) for m, _ in pairs],
        memory_source=source,
        rss_bytes=[float(r) for _, r in pairs],
        device=pm.device.type,
        first_step=first,
        losses=losses,
        host_probe_s=statistics.median(probe_s) if probe_s else None,
    )
