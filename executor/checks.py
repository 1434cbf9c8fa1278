"""Refuse a plan that does not fit the running job, before any collective.

A plan is checked against the job (world size, device) and the model (parameter count and
depth). The model fingerprint: `module_fingerprint` digests the parameter names, shapes and
dtypes; plans carry the digest of the planner's *profile*, which cannot be recomputed from a
module yet, so the executor compares what both sides know: the parameter count (tied matrices
counted once) and the number of blocks. The profiler will match `ModuleFingerprint.digest`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..planner.capabilities import plan_gaps
from ..planner.plan import Plan
from ..planner.plan_io import check_plan


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleFingerprint:
    """What identifies a model's parameters."""

    num_params: int
    """Parameter count, a tied (shared) matrix counted once."""
    digest: str
    """sha256 (16 hex digits) of the sorted (name, shape, dtype) of every parameter."""


def module_fingerprint(model: nn.Module) -> ModuleFingerprint:
    """Fingerprint of `model`'s parameters (names as `named_parameters` gives them)."""
    named = list(model.named_parameters())  # shared parameters appear once
    rows = sorted(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in named)
    digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
    return ModuleFingerprint(num_params=sum(p.numel() for _, p in named), digest=digest)


def check_plan_supported(plan: Plan) -> None:
    """Plan features the executor does not run, refused by the capability table's words
    (planner/capabilities.py: the search, `paraplan run` and this check read one table)."""
    gaps = plan_gaps(plan)
    if gaps:
        raise ValueError(f"the executor cannot run this plan: {gaps[0]}")
    check_plan(plan)  # the file rules (mesh, world size, stages) for a plan built in memory


def check_job(plan: Plan, *, world_size: int, device_type: str) -> None:
    """The running job must have the plan's world size and device kind."""
    if world_size != plan.cluster.num_gpus:
        raise ValueError(
            f"the plan is for {plan.cluster.num_gpus} ranks ({plan.cluster.name}) but this job "
            f"has world size {world_size}; launch with torchrun --nproc-per-node="
            f"{plan.cluster.num_gpus} (paraplan run does) or re-plan for {world_size} devices"
        )
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"the plan is for {plan.cluster.accelerator} GPUs but CUDA is not available here; "
            "run it on GPUs, or re-plan with --cluster <N>xcpu for a CPU run"
        )


def check_module_digest(plan: Plan, model: nn.Module) -> None:
    """A plan made from a traced module names its parameters' digest: the module given must
    match it (checked before any conversion of the module)."""
    if not plan.model.module_digest:
        return
    from paraplan.profiler.chain import module_digest

    found = module_digest(model)
    if found != plan.model.module_digest:
        raise ValueError(
            f"model fingerprint mismatch: this module's parameter names and shapes digest to "
            f"{found}, but the plan was made for {plan.model.name!r} ({plan.model.module_digest});"
            " build the model from the config the plan was made from, or re-plan for this model"
        )


def check_model(plan: Plan, model: nn.Module, *, num_blocks: int) -> None:
    """The model must be the one planned (same parameter count and depth) and runnable under
    it (no dropout with tensor parallelism)."""
    found = module_fingerprint(model).num_params
    if found != plan.model.num_params:
        raise ValueError(
            f"model fingerprint mismatch: the module has {found:,} parameters but the plan "
            f"was made for {plan.model.name!r} with {plan.model.num_params:,}; re-plan for "
            "this model (same config) or load the model the plan names"
        )
    if num_blocks != plan.model.num_blocks:
        raise ValueError(
            f"model fingerprint mismatch: the module has {num_blocks} blocks but the plan "
            f"was made for {plan.model.num_blocks}; re-plan for this model"
        )
    check_dropout(model, tp=plan.parallelism.tp)


def check_same_weights(model: nn.Module, device: torch.device) -> None:
    """Every rank must start from the same weights (FSDP keeps each rank's own shard as is);
    compares a float64 sum and sum of squares of all parameters over ranks (one all-gather)."""
    with torch.no_grad():
        stats = torch.zeros(2, dtype=torch.float64)
        for p in model.parameters():
            w = p.detach().to("cpu", torch.float64)
            stats += torch.stack([w.sum(), (w * w).sum()])
    stats = stats.to(device)
    everyone = [torch.empty_like(stats) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, stats)
    differ = [r for r, s in enumerate(everyone) if not torch.equal(s, everyone[0])]
    if differ:
        raise ValueError(
            f"ranks {differ} hold other weights than rank 0: every rank must build the model "
            "the same way; call torch.manual_seed(seed) with one seed before building it"
        )


def check_dropout(model: nn.Module, *, tp: int) -> None:
    """Dropout under tensor parallelism would draw different masks on ranks that must agree
    (replicated activations); the executor does not coordinate RNG across ranks."""
    if tp == 1:
        return
    for name, m in model.named_modules():
        p = m.p if isinstance(m, nn.Dropout) else getattr(m, "dropout_p", 0.0)
        p = p or getattr(m, "attention_dropout", 0.0)
        if isinstance(p, float | int) and p > 0:
            raise ValueError(
                f"dropout p={p} in {name or 'the model'} with tensor parallelism tp={tp}: "
                "masks would differ across TP ranks; set the config's dropout to 0 "
                "(GPT-2: resid_pdrop, embd_pdrop, attn_pdrop; Llama: attention_dropout)"
            )
