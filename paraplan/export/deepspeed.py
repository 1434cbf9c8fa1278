"""DeepSpeed: a plan as a `ds_config.json`, and DeepSpeed configurations read back.

Keys are DeepSpeed's (`deepspeed/runtime/config.py`, `zero/config.py`,
`tensor_parallel/config.py`): batch sizes, `zero_optimization` with `offload_optimizer` and
`offload_param`, `bf16`/`fp16`, AutoTP's `tensor_parallel.autotp_size`, and the pipeline
engine's `pipeline` section (`stages`, `activation_checkpoint_interval`; the stage count itself is
`PipelineModule(num_stages=...)` in the training script, the `stages` key records it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..planner.config import Precision
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from .setup import Gap, Target, TrainerSetup, check_batch, option_gaps, uniform_recompute


def nearest(plan: Plan, s: Strategy) -> tuple[Strategy, list[Gap]]:
    """The strategy DeepSpeed can run that is nearest to `s`, and what differs."""
    gaps: list[Gap] = []
    if plan.train.precision == Precision.FP8:
        gaps.append(Gap(feature="fp8 linear layers (precision fp8)", nearest=""))
    if s.cp > 1:
        gaps.append(
            Gap(
                feature=f"context parallelism (cp={s.cp}, ring attention)",
                nearest="",  # Ulysses (sequence_parallel_size) is all-to-all, another method
            )
        )
    if s.sequence_parallel:
        gaps.append(
            Gap(
                feature="sequence parallelism with TP",
                nearest="AutoTP without sequence parallelism",
            )
        )
        s = replace(s, sequence_parallel=False)
    if s.pp > 1 and s.schedule != Schedule.ONE_F_ONE_B:
        gaps.append(
            Gap(
                feature=f"{s.schedule} schedule"
                + (f" (v={s.virtual_stages})" if s.virtual_stages > 1 else ""),
                nearest="1F1B (DeepSpeed's pipeline engine has one schedule)",
            )
        )
        s = replace(s, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1)
    if s.pp > 1 and s.zero_stage >= 2:
        gaps.append(
            Gap(
                feature=f"ZeRO-{s.zero_stage} with a pipeline",
                nearest="ZeRO-1 (DeepSpeed: ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                "parallelism)",
            )
        )
        s = replace(s, zero_stage=1, dp_shard=None)
    # parameter offload is zero_optimization.offload_param (ZeRO-3 only); PowerSGD, saved-tensor
    # activation offload and the async pipeline DeepSpeed has not
    s, gaps_opt = option_gaps(
        s,
        Target.DEEPSPEED,
        has=frozenset({"offload_params"} if s.zero_stage == 3 else ()),
        why={
            "offload_params": "parameters on the GPU (DeepSpeed offloads parameters with "
            "ZeRO-3 only)",
            "offload_activations": "activations kept on the GPU (DeepSpeed's "
            "activation_checkpointing.cpu_checkpointing moves only the checkpoints of full "
            "recomputation)",
        },
    )
    gaps += gaps_opt
    if s.dp_shard is not None and s.dp_shard < s.dp:
        gaps.append(
            Gap(
                feature=f"HSDP (shard groups of {s.dp_shard} of dp={s.dp})",
                nearest="ZeRO-3 over the whole data-parallel group",
            )
        )
        s = replace(s, dp_shard=None)
    if s.recompute in (Recompute.SELECTIVE, Recompute.PER_LAYER):
        was = s.recompute
        policy = uniform_recompute(plan) if was == Recompute.PER_LAYER else Recompute.FULL
        policy = Recompute.FULL if policy == Recompute.SELECTIVE else policy
        gaps.append(
            Gap(
                feature=f"{was} recompute",
                nearest=f"{policy} for every block (DeepSpeed checkpoints whole layers)",
            )
        )
        s = replace(s, recompute=policy)
    if s.mesh_order != DEFAULT_MESH_ORDER:
        gaps.append(
            Gap(
                feature=f"mesh order {','.join(s.mesh_order)}",
                nearest="DeepSpeed's topology pipe, data, model (outermost first)",
            )
        )
        s = replace(s, mesh_order=DEFAULT_MESH_ORDER)
    return s, gaps


def config_dict(plan: Plan, s: Strategy) -> dict[str, Any]:
    """The ds_config of `s` (DeepSpeed-expressible) for `plan`'s batch and precision."""
    nmb = plan.train.global_batch // (s.dp * s.micro_batch_size)
    zero: dict[str, Any] = {"stage": s.zero_stage}
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload_params:  # ZeRO-Infinity's parameter offload (ZeRO-3)
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_batch_size": plan.train.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": nmb,
        "zero_optimization": zero,
        "bf16": {"enabled": plan.train.precision == Precision.BF16},
        "fp16": {"enabled": plan.train.precision == Precision.FP16},
    }
    if s.tp > 1:
        config["tensor_parallel"] = {"autotp_size": s.tp}
    if s.pp > 1:
        config["pipeline"] = {
            "stages": s.pp,
            "activation_checkpoint_interval": 1 if s.recompute == Recompute.FULL else 0,
        }
    elif s.recompute == Recompute.FULL:
        # without the pipeline engine the model's layers call deepspeed.checkpointing
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
        }
    return config


def render(plan: Plan, s: Strategy) -> str:
    """`config_dict` as JSON text."""
    return json.dumps(config_dict(plan, s), indent=2) + "\n"


def read(text: str, *, world_size: int, source: str) -> TrainerSetup:
    """A ds_config in the planner's terms, on `world_size` GPUs."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: a DeepSpeed config is a JSON object")
    notes: list[str] = []
    tp = int(doc.get("tensor_parallel", {}).get("autotp_size", 0) or 1)
    stages = doc.get("pipeline", {}).get("stages", "auto")
    pp = stages if isinstance(stages, int) else 1
    if world_size % (tp * pp):
        raise ValueError(
            f"{source}: tp {tp} x pp {pp} does not divide the cluster's {world_size} GPUs; "
            "fix autotp_size/pipeline.stages or give the matching --cluster"
        )
    dp = world_size // (tp * pp)
    mbs, gas, batch = (
        doc.get("train_micro_batch_size_per_gpu"),
        doc.get("gradient_accumulation_steps"),
        doc.get("train_batch_size"),
    )
    # DeepSpeed derives the missing one of the three (runtime/config.py
    # _set_batch_related_parameters): train_batch = micro x accumulation x dp
    if mbs is None and batch is not None:
        mbs = batch // (dp * (gas or 1))
    mbs = int(mbs or 1)
    batch = int(batch if batch is not None else mbs * (gas or 1) * dp)
    zero = doc.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    offload = zero.get("offload_optimizer", {}).get("device", "none") in ("cpu", "nvme")
    offload_param = zero.get("offload_param", {}).get("device", "none") in ("cpu", "nvme")
    if offload_param and not (stage == 3 and offload):
        notes.append(
            "parameter offload (offload_param) without ZeRO-3 and optimizer offload is not "
            "priced by paraplan; left out"
        )
    interval = doc.get("pipeline", {}).get("activation_checkpoint_interval", 0)
    checkpointing = "activation_checkpointing" in doc or (pp > 1 and interval > 0)
    ac = doc.get("activation_checkpointing", {})
    if isinstance(ac, dict) and checkpointing:  # deepspeed.checkpointing's options
        if ac.get("cpu_checkpointing"):
            notes.append(
                "activation_checkpointing.cpu_checkpointing not priced: the checkpoints are "
                "counted as kept on the GPU, and their copies to the host as free"
            )
        if ac.get("partition_activations") and tp > 1:
            notes.append(
                "activation_checkpointing.partition_activations not priced: each checkpoint is "
                f"counted whole on every one of the {tp} tensor-parallel ranks"
            )
    if "sequence_parallel_size" in doc:
        notes.append("Ulysses sequence_parallel_size is not priced by paraplan; left out")
    precision = (
        Precision.BF16
        if doc.get("bf16", {}).get("enabled")
        else Precision.FP16
        if doc.get("fp16", {}).get("enabled")
        else Precision.FP32
    )
    strategy = Strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        zero_stage=stage,
        offload_optimizer=offload and stage > 0,
        offload_params=offload_param and offload and stage == 3,
        schedule=Schedule.ONE_F_ONE_B if pp > 1 else Schedule.NONE,
        micro_batch_size=mbs,
        recompute=Recompute.FULL if checkpointing else Recompute.NONE,
    )
    setup = TrainerSetup(
        target=Target.DEEPSPEED,
        strategy=strategy,
        global_batch=batch,
        seq_len=None,  # DeepSpeed configs carry no sequence length: the caller supplies it
        precision=precision,
        notes=tuple(notes),
    )
    return check_batch(setup)
