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

from ..planner.config import Precision
from ..planner.cost.count_split import CountSplit
from ..planner.frameworks import torchtitan_framework
from ..planner.plan import Plan
from ..planner.strategy import DEFAULT_MESH_ORDER, Recompute, Schedule, Strategy
from .setup import Gap, Target, TrainerSetup, check_batch, option_gaps, uniform_recompute

SCHEDULE_NAMES = {
    Schedule.GPIPE: "GPipe",
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED_1F1B: "Interleaved1F1B",
    Schedule.INTERLEAVED_ZB: "InterleavedZeroBubble",
    Schedule.ZBV: "ZBVZeroBubble",
    Schedule.DUALPIPEV: "DualPipeV",
}
"""Our schedules by torchtitan's `pipeline_parallel_schedule` names (the keys of torch 2.13's
`torch.distributed.pipelining.schedules.get_schedule_class`). torchtitan places the stages of
ZBVZeroBubble and DualPipeV in a V (its `stage_ids_this_rank(..., style="v")`), as the plan's
chunk layout does."""
_LOOPED = (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV)
"""Schedules torch runs with several stages per rank (its `PipelineScheduleMulti`)."""
_LOOPED_DEFAULT_STAGES = 2
"""Stages per rank torchtitan builds for a looped schedule when no split is given."""
RECOMPUTE_MODES = {
    Recompute.NONE: "none",
    Recompute.SELECTIVE: "selective",
    Recompute.FULL: "full",
}
"""Our uniform recompute policies by torchtitan's activation-checkpoint mode (<= 0.2: `mode`;
>= 0.3: the `activation-checkpoint:<mode>` subcommand)."""
REGISTRY_CONFIGS = {
    "llama3-8b": "llama3_8b",
    "llama3-70b": "llama3_70b",
    "llama3-405b": "llama3_405b",
}
"""paraplan presets with a torchtitan `config_registry` function (module `llama3`)."""
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
    if pipelined:
        training["disable_cuda_graphs"] = True  # torchtitan refuses CUDA graphs with PP
    sections = {"parallelism": parallelism, "training": training}
    runtime = plan.train.runtime
    if runtime.fused_elementwise:  # priced compiled (`--runtime torchtitan-compile`)
        sections["compile"] = {"enable": True}
        if runtime.tp_comm_overlap and s.tp > 1:  # and Async TP (`torchtitan-async-tp`)
            sections["compile"]["enable_async_tensor_parallel"] = True
    args = " ".join(cli_args_of(sections, s))
    base = REGISTRY_CONFIGS.get(plan.model.name)
    module = f"--module llama3 --config {base}" if base else "--module <model> --config <config>"
    fp8 = plan.train.precision == Precision.FP8
    lines = [
        f"# torchtitan job config written by {plan.generator} for {plan.model.name} on "
        f"{plan.cluster.name} ({plan.cluster.num_gpus} GPUs): {plan.short()}",
        "# torchtitan <= 0.2: --job.config_file this file (merge into your model's config).",
        f"# torchtitan >= 0.3: {module} {args}",
        *(
            [
                "# fp8: torchtitan >= 0.3 takes Float8 linear layers from the config registry: "
                "Float8LinearConverter.Config(filter_fqns=['lm_head']) in model_registry's "
                "converters"
            ]
            if fp8
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


# ---- reading ---------------------------------------------------------------------------------
def read_toml(text: str, *, world_size: int, source: str) -> TrainerSetup:
    """A job-config TOML (ours or torchtitan <= 0.2's) in the planner's terms, on `world_size`
    GPUs. Raises ValueError naming the key at fault."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not a TOML file: {exc}") from None
    par, tr, ac, model, comp = (
        _section(doc, name, source)
        for name in ("parallelism", "training", "activation_checkpoint", "model", "compile")
    )
    mode = ac.get("mode", "selective")  # torchtitan's default policy
    fp8 = "float8" in model.get("converters", [])
    # torch.compile: `[compile] enable` (torchtitan >= 0.2), `[training] compile` before;
    # Async TP: `[compile]` (>= 0.3) or `[parallelism] enable_async_tensor_parallel`
    compiled = bool(comp.get("enable", tr.get("compile", False)))
    key = "enable_async_tensor_parallel"
    async_tp = bool(comp.get(key, par.get(key, False)))
    return from_values(
        par,
        tr,
        mode,
        world_size=world_size,
        source=source,
        fp8=fp8,
        compiled=compiled,
        async_tp=async_tp,
    )


def _section(doc: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    """The TOML table `name` of `doc` ({} when absent); ValueError when it is not a table."""
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(
            f"{source}: {name} = {table!r} is not a table; write it as a [{name}] section of "
            "keys (torchtitan's job-config layout)"
        )
    return table


def read_registry(name: str, *, world_size: int) -> TrainerSetup:
    """A configuration shipped inside the installed torchtitan, ``MODULE.FUNCTION`` (e.g.
    ``llama3.llama3_8b``), read by torchtitan's own `ConfigManager`."""
    module, dot, function = name.rpartition(".")
    if not dot or not module or not function:
        raise ValueError(
            f"torchtitan:{name}: expected torchtitan:MODULE.CONFIG, e.g. "
            "torchtitan:llama3.llama3_8b"
        )
    try:
        from torchtitan.config.manager import ConfigManager
    except ImportError as exc:
        raise ValueError(
            f"torchtitan:{name} needs torchtitan installed (pip install 'paraplan[export]'): {exc}"
        ) from None
    try:
        config = ConfigManager().parse_args(["--module", module, "--config", function])
    except ImportError as exc:  # an unknown module, or what the config needs (torchao)
        need = " (its Float8 linear layers need torchao: pip install torchao)" * (
            "torchao" in str(exc)
        )
        raise ValueError(
            f"torchtitan:{name}: torchtitan cannot build this config here{need}: "
            f"{str(exc).rstrip('.')}; or "
            "write it to a job-config TOML file and pass that to --from-config"
        ) from None
    par = _fields(config.parallelism)
    tr = _fields(config.training)
    ac = config.activation_checkpoint
    mode = "none" if ac is None else type(ac).__qualname__.split(".")[0].removesuffix("AC").lower()
    # a Float8 converter replaces the blocks' Linear configs in the model tree (torchao's
    # Float8Linear); torchao absent, building such a config fails above instead
    fp8 = "Float8" in repr(getattr(getattr(config, "model_spec", None), "model", None))
    compiled = bool(getattr(getattr(config, "compile", None), "enable", False))
    async_tp = bool(getattr(config.compile, "enable_async_tensor_parallel", False))
    return from_values(
        par,
        tr,
        mode,
        world_size=world_size,
        source=f"torchtitan:{name}",
        fp8=fp8,
        compiled=compiled,
        async_tp=async_tp,
    )


def _fields(obj: Any) -> dict[str, Any]:
    """A torchtitan config dataclass (slots) as a dict."""
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def from_values(
    par: dict[str, Any],
    tr: dict[str, Any],
    mode: str,
    *,
    world_size: int,
    source: str,
    fp8: bool = False,
    compiled: bool = False,
    async_tp: bool = False,
) -> TrainerSetup:
    """torchtitan's parallelism/training/activation-checkpoint values (its defaults where a
    key is absent) in the planner's terms; `fp8`: Float8 linear layers are on; `compiled`:
    torch.compile is, `async_tp`: with Async TP (the runtime: torchtitan-compile's or
    torchtitan-async-tp's preset, else torchtitan's)."""
    notes: list[str] = []
    tp = int(par.get("tensor_parallel_degree", 1))
    pp = int(par.get("pipeline_parallel_degree", 1))
    cp = int(par.get("context_parallel_degree", 1))
    ep = int(par.get("expert_parallel_degree", 1))
    replicate = int(par.get("data_parallel_replicate_degree", 1))
    shard = int(par.get("data_parallel_shard_degree", -1))
    if shard == -1:  # torchtitan: the ranks left over after the other axes
        shard = world_size // (replicate * tp * pp * cp)
    if min(tp, pp, cp, ep, replicate, shard) < 1 or replicate * shard * tp * pp * cp != world_size:
        raise ValueError(
            f"{source}: replicate {replicate} x shard {shard} x tp {tp} x pp {pp} x cp {cp} "
            f"does not use the cluster's {world_size} GPUs; set the degrees so their product "
            f"is {world_size} (or give the matching --cluster)"
        )
    dp = replicate * shard
    reshard = par.get("fsdp_reshard_after_forward", "default")
    # torchtitan's "default" reshards after forward except under a pipeline (never there)
    if shard == 1:
        zero = 0
    elif reshard == "never" or (reshard == "default" and pp > 1):
        zero = 2
    else:
        zero = 3
    if zero == 2 and replicate > 1:
        notes.append("HSDP without resharding after forward is evaluated as ZeRO-2 over all dp")
    schedule, vstages = Schedule.NONE, 1
    if pp > 1:
        name = par.get("pipeline_parallel_schedule", "1F1B")
        found = [k for k, v in SCHEDULE_NAMES.items() if v.lower() == str(name).lower()]
        if not found:
            raise ValueError(
                f"{source}: pipeline_parallel_schedule {name!r} has no paraplan model; use one "
                f"of {', '.join(SCHEDULE_NAMES.values())}"
            )
        schedule = found[0]
        parts = par.get("module_fqns_per_model_part")
        if parts:
            vstages = len(parts) // pp
        elif schedule in _LOOPED and not par.get("pipeline_parallel_layers_per_stage"):
            vstages = _LOOPED_DEFAULT_STAGES
            notes.append(f"no module_fqns_per_model_part: {vstages} stages per rank assumed")
    local = int(tr.get("local_batch_size", 8))
    mbs = int(par.get("pipeline_parallel_microbatch_size", 1)) if pp > 1 else local
    glob = int(tr.get("global_batch_size", -1))
    glob = local * dp if glob <= 0 else glob
    if pp > 1 and glob > local * dp:
        notes.append(
            f"{glob // (local * dp)} accumulated pipeline passes evaluated as one pass of all "
            "micro-batches (one fill and drain instead of several)"
        )
    policy = {v: k for k, v in RECOMPUTE_MODES.items()}.get(mode)
    if policy is None:
        raise ValueError(
            f"{source}: activation checkpoint mode {mode!r} has no paraplan model; use "
            + ", ".join(RECOMPUTE_MODES.values())
        )
    dtype, param = tr.get("dtype", "float32"), tr.get("mixed_precision_param", "bfloat16")
    if dtype == "bfloat16":
        notes.append("pure bf16 training (no fp32 master weights) evaluated as bf16 mixed")
    precision = Precision.BF16 if "bfloat16" in (dtype, param) else Precision.FP32
    if fp8 and precision == Precision.BF16:
        precision = Precision.FP8
    offload = bool(tr.get("enable_cpu_offload", False)) and zero > 0
    if offload and zero < 3:  # FSDP2 keeps unsharded parameters on the GPU
        notes.append("training.enable_cpu_offload evaluated as optimizer offload only")
    folded = ep > 1 and tp > 1  # torchtitan's EP borrows the TP ranks: experts whole
    if folded and ep % tp:
        notes.append(
            f"expert_parallel_degree {ep} folded over tensor_parallel_degree {tp} is priced as "
            "experts split over TP (paraplan folds an ep that is a multiple of tp)"
        )
    strategy = Strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        expert_tp=1 if folded and ep % tp == 0 else None,
        zero_stage=zero,
        dp_shard=shard if zero == 3 and replicate > 1 else None,
        offload_optimizer=offload,
        offload_params=offload and zero == 3,
        sequence_parallel=tp > 1 and bool(par.get("enable_sequence_parallel", True)),
        schedule=schedule,
        virtual_stages=vstages,
        micro_batch_size=mbs,
        recompute=policy,
    )
    setup = TrainerSetup(
        target=Target.TORCHTITAN,
        strategy=strategy,
        global_batch=glob,
        seq_len=int(tr.get("seq_len", 2048)),
        precision=precision,
        notes=tuple(notes),
        runtime=torchtitan_framework(compiled=compiled, async_tp=async_tp),
        split=CountSplit.of_torchtitan(par) if pp > 1 else None,
    )
    return check_batch(setup)
