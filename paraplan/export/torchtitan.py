"""torchtitan: a plan as a job-config TOML, and torchtitan configurations read back.

The TOML uses torchtitan's own section and key names (`[parallelism]`, `[training]`,
`[activation_checkpoint]`), the job-config file torchtitan <= 0.2 reads with
``--job.config_file``. torchtitan >= 0.3 builds its configuration in Python
(`config_registry` functions such as ``llama3_8b``) and takes the same keys as command-line
overrides; `cli_args` turns the TOML into them (``--parallelism.tensor-parallel-degree 8 ...
activation-checkpoint:full``), which torchtitan's `ConfigManager.parse_args` validates.
`read_registry` reads a configuration shipped inside the installed torchtitan
(``torchtitan:llama3.llama3_8b``) through that same `ConfigManager`.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from typing import Any

from ..planner.config import EpDispatch, Precision
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Strategy
from .setup import Gap, StatedWindows, Target, option_gaps, uniform_recompute
from .torchtitan_read import (
    _LOOPED,
    RECOMPUTE_MODES,
    SCHEDULE_NAMES,
    from_values,
    read_registry,
    read_toml,
)

__all__ = [
    "RECOMPUTE_MODES",
    "SCHEDULE_NAMES",
    "_LOOPED",
    "cli_args",
    "from_values",
    "nearest",
    "read_registry",
    "read_toml",
    "render",
]

REGISTRY_CONFIGS = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
}
"""paraplan presets with a torchtitan (>= 0.3) `config_registry` function: module, function
(torchtitan's `models/<module>/config_registry.py`, checked by parsing them in the export
tests); the written flags override the function's parallelism, batch and recompute."""
_PRECISION_PARAM = {
    Precision.BF16: "bfloat16",
    Precision.FP8: "bfloat16",
    Precision.FP32: "float32",
}
"""`training.mixed_precision_param` per precision (torchtitan has no fp16 training; fp8 is bf16
with Float8 linear layers)."""
FLOAT8_SECTIONS = {"model": {"converters": ["float8"]}, "float8": {"filter_fqns": ["output"]}}
_HEAD_03 = {"output": "lm_head"}  # the head's module name in torchtitan >= 0.3 (`Decoder`)
"""torchtitan <= 0.2's Float8 linear layers for every block (the output head left in bf16, as
paraplan prices fp8: `planner/cost/float8.py`); torchtitan >= 0.3 takes them from the config
registry (`Float8LinearConverter` in `model_registry(converters=...)`), not the command line."""


def nearest(plan: Plan, s: Strategy) -> tuple[Strategy, list[Gap]]:
    """The strategy torchtitan can run that is nearest to `s`, and what differs."""
    gaps: list[Gap] = []
    if plan.train.precision == Precision.FP16:
        gaps.append(Gap(feature="fp16 mixed precision", nearest=""))
    if s.zero_stage == 1:
        gaps.append(
            Gap(
                feature="ZeRO-1 (zero_stage=1: only optimizer states sharded)",
                nearest="FSDP with fsdp_reshard_after_forward='never' (ZeRO-2)",
            )
        )
        s = replace(s, zero_stage=2)
    # PowerSGD, activation offload and the async pipeline torchtitan has not; parameter offload
    # it has: training.enable_cpu_offload is FSDP2's CPUOffloadPolicy (parameters, gradients
    # and optimizer states on the host), exactly ZeRO-3 with offload_params
    s, gaps_opt = option_gaps(s, Target.TORCHTITAN, has=frozenset({"offload_params"}))
    gaps += gaps_opt
    if s.offload_optimizer and not s.offload_params:
        gaps.append(
            Gap(
                feature="optimizer offload (offload_optimizer=true)",
                nearest="no offload (torchtitan's training.enable_cpu_offload also moves "
                "parameters and gradients to the host, which paraplan does not price)",
            )
        )
        s = replace(s, offload_optimizer=False)
    if s.recompute == Recompute.PER_LAYER:
        policy = uniform_recompute(plan)
        gaps.append(
            Gap(
                feature="per-layer recompute (each block its own policy)",
                nearest=f"{policy} for every block (torchtitan has one policy for all)",
            )
        )
        s = replace(s, recompute=policy)
    if s.ep_dp > 1 and s.zero_stage < 2:
        gaps.append(
            Gap(
                feature=f"expert parallelism beside replicated data parallelism (zero_stage="
                f"{s.zero_stage})",
                nearest="FSDP without resharding after forward (ZeRO-2): torchtitan's EP "
                "borrows the dp_shard ranks",
            )
        )
        s = replace(s, zero_stage=2)
    if plan.model.experts and s.tp > 1 and not s.folded_experts:
        # torchtitan (0.3) never splits experts over TP: its EP borrows the dp_shard, cp and
        # tp ranks (efsdp = dp_shard * cp * tp / ep), each expert whole on one rank. ep * tp
        # folded keeps each rank's expert share and the experts' gradient group.
        ep = s.ep * s.tp
        fits = plan.model.experts % ep == 0
        gaps.append(
            Gap(
                feature=f"experts split over TP (expert_tp={s.tp})",
                nearest=f"ep={ep} folded over TP (experts whole; torchtitan's EP borrows the TP "
                "ranks)"
                if fits
                else "",
            )
        )
        if fits:
            s = replace(s, ep=ep, expert_tp=1)
    if s.mesh_order != DEFAULT_MESH_ORDER:
        gaps.append(
            Gap(
                feature=f"mesh order {','.join(s.mesh_order)}",
                nearest="torchtitan's fixed order pp,dp,cp,tp (outermost first)",
            )
        )
        s = replace(s, mesh_order=DEFAULT_MESH_ORDER)
    return s, gaps


def render(plan: Plan, s: Strategy) -> str:
    """The job-config TOML of `s` (torchtitan-expressible) for `plan`'s model and batch."""
    pipelined = s.pp > 1
    nmb = plan.train.global_batch // (s.dp * s.micro_batch_size)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": s.dp_replicate if s.zero_stage == 3 else 1,
        "data_parallel_shard_degree": s.shard_dp if s.zero_stage >= 2 else 1,
        "fsdp_reshard_after_forward": "always" if s.zero_stage == 3 else "never",
        "tensor_parallel_degree": s.tp,
        "enable_sequence_parallel": s.sequence_parallel,
        "pipeline_parallel_degree": s.pp,
        "context_parallel_degree": s.cp,
        "expert_parallel_degree": s.ep,
    }
    if s.zero_stage == 0:
        parallelism["data_parallel_replicate_degree"] = s.dp
    if pipelined:
        parallelism["pipeline_parallel_schedule"] = SCHEDULE_NAMES[s.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = s.micro_batch_size
        parallelism["module_fqns_per_model_part"] = model_parts(plan, s)
    training: dict[str, Any] = {
        # with a pipeline, one local batch is all micro-batches of one pass (no accumulation);
        # without, a local batch is one micro-batch and torchtitan accumulates the rest
        "local_batch_size": s.micro_batch_size * nmb if pipelined else s.micro_batch_size,
        "global_batch_size": plan.train.global_batch,
        "seq_len": plan.train.seq_len,
        "dtype": "float32",
        "mixed_precision_param": _PRECISION_PARAM[plan.train.precision],
    }
    if s.offload_params:  # FSDP2 CPUOffloadPolicy: parameters, gradients, optimizer states
        training["enable_cpu_offload"] = True
    if pipelined or s.ep > 1:  # torchtitan refuses CUDA graphs with PP, and with EP over its
        # default all-to-all token dispatcher, which synchronizes with the CPU
        # (`Trainer.Config.__post_init__`; priced with the all-to-all)
        training["disable_cuda_graphs"] = True
    sections = {"parallelism": parallelism, "training": training}
    runtime = plan.train.runtime
    if runtime.fused_elementwise:  # priced compiled (`--runtime torchtitan-compile`)
        sections["compile"] = {"enable": True}
        if runtime.tp_comm_overlap and s.tp > 1:  # and Async TP (`torchtitan-async-tp`)
            sections["compile"]["enable_async_tensor_parallel"] = True
    args = " ".join(cli_args_of(sections, s))
    known = REGISTRY_CONFIGS.get(plan.model.name)
    module = "--module {} --config {}".format(*(known or ("<model>", "<config>")))
    fp8 = plan.train.precision == Precision.FP8
    lines = [
        f"# torchtitan job config written by {plan.generator} for {plan.model.name} on "
        f"{plan.cluster.name} ({plan.cluster.num_gpus} GPUs): {plan.short()}",
        "# torchtitan <= 0.2: --job.config_file this file (merge into your model's config).",
        f"# torchtitan >= 0.3: {module} {args}",
        *(
            [
                f"# the plan prices {StatedWindows.describe(plan.model.attention_windows)} of "
                f"{plan.model.num_blocks}: keep them in the model's config"
            ]
            if plan.model.windowed
            else []
        ),
        *(
            [
                "# fp8: torchtitan >= 0.3 takes Float8 linear layers from the config registry: "
                "Float8LinearConverter.Config(filter_fqns=['lm_head']) in model_registry's "
                "converters"
            ]
            if fp8
            else []
        ),
        *(
            [
                f"# the plan trains {plan.train.mtp_layers} multi-token-prediction module(s): "
                "torchtitan >= 0.3 takes them from the config registry, "
                f"model_registry(..., num_mtp_layers={plan.train.mtp_layers}) with MTPLoss"
            ]
            if plan.train.mtp_layers
            else []
        ),
        *(
            [
                "# the experts' tokens are priced dispatched once per node (DeepEP): torchtitan "
                "takes it from the config registry, the model's token dispatcher built with "
                "comm_backend='deepep' (make_token_dispatcher_config)"
            ]
            if s.ep > 1 and runtime.ep_dispatch == EpDispatch.HIERARCHICAL
            else []
        ),
        "",
        "[parallelism]",
        *(f"{k} = {_toml(v)}" for k, v in parallelism.items()),
        "",
        "[training]",
        *(f"{k} = {_toml(v)}" for k, v in training.items()),
        "",
        "[activation_checkpoint]",
        f'mode = "{RECOMPUTE_MODES[s.recompute]}"',
        # torchtitan <= 0.2 reads "selective" with no option as every 2nd block checkpointed
        *(['selective_ac_option = "op"'] if s.recompute == Recompute.SELECTIVE else []),
        "",
        *(
            ["[compile]", *(f"{k} = {_toml(v)}" for k, v in sections["compile"].items()), ""]
            if "compile" in sections
            else []
        ),
    ]
    for section, values in FLOAT8_SECTIONS.items() if fp8 else ():
        lines += [f"[{section}]", *(f"{k} = {_list(v)}" for k, v in values.items()), ""]
    return "\n".join(lines)


def _list(names: list[str]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def model_parts(plan: Plan, s: Strategy) -> list[list[str]]:
    """The plan's pipeline chunks as torchtitan module names, in model order (chunk c of the
    model runs on rank c mod pp, as torchtitan's looped schedules place them)."""
    last = len(plan.layers) - 1
    chunks = sorted((c for st in plan.stages for c in st.chunks), key=lambda c: c.chunk)
    if len(chunks) != s.pp * s.virtual_stages:
        raise ValueError(
            f"plan has {len(chunks)} pipeline chunks, expected pp x virtual_stages = "
            f"{s.pp * s.virtual_stages}; re-plan to write a consistent plan"
        )
    parts: list[list[str]] = []
    for c in chunks:
        names: list[str] = []
        for i in range(c.first_layer, c.last_layer + 1):
            names += (
                ["tok_embeddings"]
                if i == 0
                else ["norm", "output"]
                if i == last
                else [f"layers.{i - 1}"]
            )
        parts.append(names)
    return parts


def cli_args(toml_text: str) -> list[str]:
    """A job-config TOML as torchtitan >= 0.3 command-line overrides (to follow
    ``--module M --config C``)."""
    doc = tomllib.loads(toml_text)
    mode = doc.get("activation_checkpoint", {}).get("mode")
    policy = {v: k for k, v in RECOMPUTE_MODES.items()}.get(mode or "none", Recompute.NONE)
    skip = ("activation_checkpoint", *FLOAT8_SECTIONS)  # fp8: from the registry in >= 0.3
    sections = {k: v for k, v in doc.items() if k not in skip}
    out = cli_args_of(sections, None)
    return [*out, f"activation-checkpoint:{RECOMPUTE_MODES[policy]}"] if mode else out


def cli_args_of(sections: dict[str, dict[str, Any]], s: Strategy | None) -> list[str]:
    """``--section.key value`` for every key (booleans as ``--section.[no-]key``), then the
    activation-checkpoint subcommand of `s` (when given)."""
    out: list[str] = []
    for section, values in sections.items():
        for key, value in values.items():
            flag = f"--{section}.{key.replace('_', '-')}"
            if isinstance(value, bool):
                out.append(flag if value else f"--{section}.no-{key.replace('_', '-')}")
            elif isinstance(value, list):  # the head is `output` up to 0.2, `lm_head` since 0.3
                out += [flag, *(",".join(_HEAD_03.get(n, n) for n in part) for part in value)]
            else:
                out += [flag, str(value)]
    if s is not None:
        out.append(f"activation-checkpoint:{RECOMPUTE_MODES[s.recompute]}")
    return out


def _toml(value: Any) -> str:
    """A TOML value (ints, bools, strings, lists of string lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    return "[" + ", ".join("[" + ", ".join(f'"{n}"' for n in part) + "]" for part in value) + "]"
