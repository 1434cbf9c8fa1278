"""Helpers for the executor tests: launching ranks (torchrun or plain processes), and the
torchrun worker that runs the multi-process checks (``python -m torch.distributed.run ...
tests/executor_helpers.py <scenario> <out_dir> <args>``); results come back as JSON files. Tiny
models and hand-built plans are in `executor_plans.py`."""

from __future__ import annotations

import copy
import gc
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib

import torch
import torch.distributed as dist

from paraplan.planner.plan import Plan
from paraplan.planner.plan_io import load_plan
from tests.executor_plans import (  # noqa: F401 (re-exported for the tests)
    LAYERS,
    ROOT,
    SEQ_LEN,
    make_plan,
    tiny_model,
    write_plans,
)


def launch(
    nproc: int,
    scenario: str,
    out_dir: Path,
    *args: str,
    timeout_s: float = 240,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run this file's `scenario` under torchrun with `nproc` ranks."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        __file__,
        scenario,
        str(out_dir),
        *args,
    ]
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=ROOT
    )


def free_port() -> int:
    """A TCP port free at the time of asking."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_ranks(
    nproc: int, scenario: str, out_dir: Path, *args: str, wait_s: float, wait_all: bool = False
) -> tuple[list[int | None], float, str]:
    """Start the ranks as plain processes (no torchrun, so nothing else kills them), wait up to
    `wait_s` for rank 0 (for every rank with `wait_all`), then end the others. Returns (exit
    codes, seconds rank 0 took, rank 0's stderr); a code is None for a rank that was still
    running and had to be killed."""
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, scenario, str(out_dir), *args],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    start = time.monotonic()
    try:
        _, err = procs[0].communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        _, err = procs[0].communicate()
    elapsed = time.monotonic() - start
    codes: list[int | None] = [procs[0].returncode]
    for proc in procs[1:]:
        if wait_all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, wait_s - (time.monotonic() - start)))
        code = proc.poll()
        if code is None:
            proc.kill()
        proc.communicate()
        codes.append(code)
    return codes, elapsed, err


def synthetic_batch(plan: Plan, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: token ids and next-token labels, (global_batch, T) each."""
    from paraplan.executor.data import synthetic_tokens

    return synthetic_tokens(
        plan.train.global_batch, plan.train.seq_len, plan.model.vocab, seed=1234, step=step
    )


# ---- worker scenarios (inside torchrun) -------------------------------------------------------


def _numerics_one(path: str) -> dict[str, object]:
    """Parallel loss and gradients against the single-process reference, then one SGD step
    and the next loss."""
    import torch.nn.functional as F

    from paraplan.executor import parallelize
    from paraplan.executor.compose import causal_lm_loss
    from paraplan.executor.optim import Optimizers

    plan = load_plan(path)
    family = plan.model.name.removesuffix("-tiny")
    model = tiny_model(family)
    ref = copy.deepcopy(model)
    lr = 0.5
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref_losses, ref_grads = [], {}
    for step in range(2):
        x, y = synthetic_batch(plan, step)
        ref_opt.zero_grad()
        loss = causal_lm_loss(ref(x).logits, y)
        loss.backward()
        ref_losses.append(loss.item())
        if step == 0:
            ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        ref_opt.step()
    del F

    pm = parallelize(model, plan, timeout_s=60)
    opt = Optimizers(pm, lr=lr, name="sgd")  # the plan's sharding of states (ZeRO-1)
    losses, grad_err, checked = [], {}, []
    counter = _Collectives()
    for step in range(2):
        x, y = synthetic_batch(plan, step)
        opt.zero_grad()
        with counter if step == 0 else contextlib.nullcontext():
            loss = pm.forward_backward(pm.local_batch(x), pm.local_batch(y))
        losses.append(_global_loss(pm, loss))
        if step == 0:
            chain = pm.chains[0]
            grads = chain.hf_names(pm.named_tensors("grad"))
            for name, g in grads.items():
                ref_g = ref_grads[name]
                err = (g - ref_g).abs().max().item() / max(1e-3, ref_g.abs().max().item())
                grad_err[name] = max(grad_err.get(name, 0.0), err)
            checked = sorted(grads)
        opt.step()
    return {
        "ref_losses": ref_losses,
        "losses": losses,
        "grad_rel_err": grad_err,
        "layout": dict(_layout(pm), optimizer=type(opt.optimizers[0]).__name__),
        "checked": checked,
        "collectives": counter.calls,
        "outputs_kept": _outputs_kept(pm),
    }


def _outputs_kept(pm: object) -> int:
    """Micro-batch outputs the pipeline's stages still hold after the step (torch's
    `output_chunks`: the last stage's logits, unless the schedule is asked not to keep them)."""
    schedule = getattr(pm, "schedule", None)
    if schedule is None:
        return 0
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    return sum(len(stage.output_chunks) for stage in stages)


class _Collectives:
    """The functional collectives one forward and backward run (DTensor's redistributions),
    as [operator, elements of the first input], read from the torch profiler's events."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )

    def __enter__(self) -> _Collectives:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        for event in self._prof.events():
            name = event.name
            if name.startswith("_c10d_functional::") and not name.endswith("wait_tensor"):
                shape = event.input_shapes[0] if event.input_shapes else []
                self.calls.append((name.split("::", 1)[1], math.prod(shape)))


def _layout(pm: object) -> dict[str, object]:
    """What was applied, read back from the modules: schedule, data-parallel wrapper, the first
    block's q_proj placements, blocks under activation checkpointing, CPU offload, logits
    sharded over the vocabulary, the embedding table's placements."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
    from torch.distributed.tensor import DTensor

    chains, part = pm.chains, pm.parts[0]  # type: ignore[attr-defined]
    block = next(iter(chains[0].blocks.values()))
    q = next(p for n, p in block.named_parameters() if n.endswith("q_proj.weight"))
    offload = False
    if isinstance(part, FSDPModule):
        state = part._get_fsdp_state()  # FSDP or replicate; a root without own parameters
        groups = [s._fsdp_param_group for s in state._state_ctx.all_states]  # has no group
        offload = any(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups if g)
    return {
        "schedule": type(pm.schedule).__name__ if pm.schedule else None,  # type: ignore[attr-defined]
        "wrapper": type(part).__name__,
        "placements": [str(p) for p in q.placements] if isinstance(q, DTensor) else [],
        "recompute": sorted(  # the blocks (model indices) this rank checkpoints
            int(k) for c in chains for k, b in c.blocks.items() if checkpoint.state(b) is not None
        ),
        "offload": offload,
        "vocab_parallel": pm.vocab_parallel,  # type: ignore[attr-defined]
        "embed_placements": _placements(chains[0].embed) if chains[0].embed else [],
    }


def _placements(embed: torch.nn.Module) -> list[str]:
    """Placements of the embedding table (the first parameter with a vocabulary dim)."""
    from torch.distributed.tensor import DTensor

    table = max(embed.parameters(), key=lambda p: p.shape[0])
    return [str(p) for p in table.placements] if isinstance(table, DTensor) else []


def _global_loss(pm: object, loss: torch.Tensor | None) -> float:
    from paraplan.executor.training import global_loss

    return global_loss(pm, loss)  # type: ignore[arg-type]


def _write(out: Path, payload: object) -> None:
    path = out / f"rank{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(payload, indent=1))


def scenario_numerics(out: Path, paths: list[str]) -> None:
    """Each plan against the reference; results by plan name."""
    _write(out, {Path(p).stem: _numerics_one(p) for p in paths})
    _finish()


def scenario_mismatch(out: Path, args: list[str]) -> None:
    """parallelize must refuse the plan: a wrong world size before the process group exists;
    ranks seeded differently (``seed_by_rank``) right after it."""
    from paraplan.executor import parallelize

    seed = int(os.environ["RANK"]) if args[1:] == ["seed_by_rank"] else 0
    try:
        parallelize(tiny_model(seed=seed), load_plan(args[0]), timeout_s=60)
    except ValueError as exc:
        _write(out, {"error": str(exc), "initialized": dist.is_initialized()})
        sys.exit(3)
    _write(out, {"error": None, "initialized": dist.is_initialized()})


def scenario_dead_rank(out: Path, args: list[str]) -> None:
    """Rank 1 crashes (``crash``) or hangs (``hang``) at step 3; the others must raise."""
    from paraplan.executor import parallelize
    from paraplan.executor.optim import Optimizers
    from paraplan.executor.training import global_loss, train_step

    mode, plan, timeout_s = args[0], load_plan(args[1]), float(args[2])
    pm = parallelize(tiny_model(), plan, timeout_s=timeout_s)
    opts = Optimizers(pm, lr=1e-3)
    last = time.monotonic()
    try:
        for step in range(100):
            if step == 3 and dist.get_rank() == 1:
                if mode == "crash":
                    os._exit(7)
                time.sleep(3600)
            x, y = synthetic_batch(plan, step)
            global_loss(pm, train_step(pm, opts, pm.local_batch(x), pm.local_batch(y)))
            last = time.monotonic()
    except Exception as exc:
        _write(out, {"error": repr(exc)[:2000], "elapsed_s": time.monotonic() - last})
        print(f"rank {dist.get_rank()} failed as it should: {exc!r}"[:500], file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    _write(out, {"error": None, "elapsed_s": 0.0})


def scenario_resume(out: Path, args: list[str]) -> None:
    """``crash``: train each plan 6 steps saving every 2, die after step 5 (index 4).
    ``resume``: resume each to step 6, then train uninterrupted; losses by plan name."""
    from paraplan.executor import parallelize
    from paraplan.executor.training import RunOptions, train

    phase, ckpt, paths = args[0], Path(args[1]), args[2:]
    results = {}
    for path in paths:
        plan, name = load_plan(path), Path(path).stem
        folder = str(ckpt / name)
        if phase == "crash":
            options = RunOptions(steps=6, warmup_steps=0, checkpoint_dir=folder, save_every=2)
            pm = parallelize(tiny_model(), plan, timeout_s=60)
            if name == Path(paths[-1]).stem:

                def die(step: int, loss: float) -> None:
                    if step == 4:
                        os._exit(9)  # killed mid-way: steps 0-4 ran, step-4 is the last save

                train(pm, options, on_step=die)
            else:
                train(pm, replace(options, steps=5))
            continue
        resumed = train(
            parallelize(tiny_model(), plan, timeout_s=60),
            RunOptions(steps=6, warmup_steps=0, checkpoint_dir=folder, resume=True),
        )
        whole = train(
            parallelize(tiny_model(), plan, timeout_s=60), RunOptions(steps=6, warmup_steps=0)
        )
        results[name] = {
            "resumed_first": resumed.first_step,
            "resumed": resumed.losses,
            "whole": whole.losses,
        }
    _write(out, results)
    _finish()


def _finish() -> None:
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


SCENARIOS = {
    "numerics": scenario_numerics,
    "mismatch": scenario_mismatch,
    "dead_rank": scenario_dead_rank,
    "resume": scenario_resume,
}


def main(argv: list[str]) -> None:
    scenario, out, args = argv[0], Path(argv[1]), argv[2:]
    t0 = time.perf_counter()
    SCENARIOS[scenario](out, args)
    if os.environ.get("RANK", "0") == "0":
        print(f"{scenario}: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
