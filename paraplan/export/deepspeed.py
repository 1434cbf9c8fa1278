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
from ..planner.inputs import parse_json
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from .setup import Gap, Target, TrainerSetup, check_batch, option_gaps, uniform_recompute


def nearest(plan: Plan, s: Strategy) -> tuple[Strategy, list[Gap]]:
    """The strategy DeepSpeed can run that is nearest to `s`, and what differs."""
    gaps: list[Gap] = []
    if plan.train.precision == Precision.FP8:
        gaps.append(Gap(feature="fp8 linear layers (precision fp8)", nearest=""))
    if plan.train.mtp_layers:  # DeepSpeed trains the model it is given: no modules of its own
        gaps.append(
            Gap(
                feature=f"{plan.train.mtp_layers} multi-token-prediction module(s)",
                nearest="the model's own forward (DeepSpeed adds none)",
            )
        )
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


def _object(doc: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """The JSON object `doc[key]` ({} when absent); ValueError when it is something else."""
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(
            f"{source}: {key} = {json.dumps(value)} is not an object; write it as "
            f'"{key}": {{...}} (DeepSpeed\'s layout)'
        )
    return value


def _not_auto(value: Any, key: str, source: str, fix: str) -> None:
    """ValueError when `value` is "auto", the Hugging Face Trainer's placeholder (filled from
    its own arguments), naming `key` and the `fix`."""
    if value == "auto":
        raise ValueError(
            f'{source}: {key} is "auto", which the Hugging Face Trainer fills from its own '
            f"arguments; {fix}"
        )


def _whole(value: Any, key: str, source: str, *, least: int = 1) -> int | None:
    """A count of the config (None when absent); ValueError naming it when it is "auto" (the
    Hugging Face Trainer's placeholder, filled from its own arguments) or not a whole number."""
    if value is None:
        return None
    _not_auto(value, key, source, "write the number you train with")
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{source}: {key} {json.dumps(value)} must be a whole number >= {least}")
    return value


def _enabled(doc: dict[str, Any], key: str, source: str) -> bool:
    """`doc[key].enabled` (false when absent); ValueError on "auto" or a non-boolean."""
    value = _object(doc, key, source).get("enabled", False)
    _not_auto(value, f"{key}.enabled", source, "write true or false")
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key}.enabled {json.dumps(value)} must be true or false")
    return value


def read(text: str, *, world_size: int, source: str) -> TrainerSetup:
    """A ds_config in the planner's terms, on `world_size` GPUs."""
    # nesting depth, duplicate keys and finite numbers checked (`planner.inputs`)
    doc = parse_json(text, origin=source, hint="give a DeepSpeed config (a JSON object)")
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: a DeepSpeed config is a JSON object")
    notes: list[str] = []
    pipeline = _object(doc, "pipeline", source)
    tp = (
        _whole(
            _object(doc, "tensor_parallel", source).get("autotp_size"),
            "autotp_size",
            source,
            least=0,
        )
        or 1
    )
    stages = pipeline.get("stages", "auto")  # "auto": DeepSpeed's own, no pipeline here
    pp = 1 if stages == "auto" else _whole(stages, "pipeline.stages", source) or 1
    if world_size % (tp * pp):
        raise ValueError(
            f"{source}: tp {tp} x pp {pp} does not divide the cluster's {world_size} GPUs; "
            "fix autotp_size/pipeline.stages or give the matching --cluster"
        )
    dp = world_size // (tp * pp)
    mbs, gas, batch = (
        _whole(doc.get(key), key, source)
        for key in (
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "train_batch_size",
        )
    )
    # DeepSpeed derives the missing one of the three (runtime/config.py
    # _set_batch_related_parameters): train_batch = micro x accumulation x dp
    if mbs is None and batch is not None:
        mbs = batch // (dp * (gas or 1))
    mbs = int(mbs or 1)
    batch = int(batch if batch is not None else mbs * (gas or 1) * dp)
    zero = _object(doc, "zero_optimization", source)
    stage = _whole(zero.get("stage", 0), "zero_optimization.stage", source, least=0) or 0
    if stage > 3:
        raise ValueError(f"{source}: zero_optimization.stage {stage} must be 0, 1, 2 or 3")
    offload = _object(zero, "offload_optimizer", source).get("device", "none") in ("cpu", "nvme")
    offload_param = _object(zero, "offload_param", source).get("device", "none") in ("cpu", "nvme")
    if offload_param and not (stage == 3 and offload):
        notes.append(
            "parameter offload (offload_param) without ZeRO-3 and optimizer offload is not "
            "priced by paraplan; left out"
        )
    interval = _whole(
        pipeline.get("activation_checkpoint_interval", 0),
        "pipeline.activation_checkpoint_interval",
        source,
        least=0,
    )
    checkpointing = "activation_checkpointing" in doc or (pp > 1 and bool(interval))
    ac = _object(doc, "activation_checkpointing", source)
    if "activation_checkpointing" in doc:  # configures deepspeed.checkpointing, applies nothing
        notes.append(
            "activation_checkpointing read as every block recomputed (the model's code decides "
            "what deepspeed.checkpointing wraps)"
        )
    if checkpointing:  # deepspeed.checkpointing's options
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
    bf16, fp16 = _enabled(doc, "bf16", source), _enabled(doc, "fp16", source)
    precision = Precision.BF16 if bf16 else Precision.FP16 if fp16 else Precision.FP32
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
