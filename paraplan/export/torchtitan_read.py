"""torchtitan configurations read back in the planner's terms: a job-config TOML (ours or
torchtitan <= 0.2's, `read_toml`) or a configuration shipped inside the installed torchtitan
(`read_registry`, through torchtitan's own `ConfigManager`)."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from ..planner.config import Precision
from ..planner.cost.count_split import CountSplit
from ..planner.cost.recompute_pattern import PatternRule, RecomputePattern
from ..planner.frameworks import torchtitan_framework
from ..planner.strategy import Recompute, Schedule, Strategy
from .setup import ModelSays, Stated, Target, TrainerSetup, check_batch

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


_LLAMA3_FLAVORS = {
    "debugmodel": (6, 256, 16, 16),
    "8B": (32, 4096, 32, 8),
    "70B": (80, 8192, 64, 8),
    "405B": (126, 16384, 128, 8),
}
"""torchtitan <= 0.2's Llama 3 flavors (`[model] name = "llama3"`): blocks, hidden size, heads
and key/value heads (`llama3_args`, torchtitan/models/llama3/__init__.py, v0.2.0)."""


def _flavor_says(model: dict[str, Any]) -> ModelSays | None:
    """The sizes a TOML's `[model]` flavor names, where paraplan knows the flavor."""
    name, flavor = str(model.get("name", "")), str(model.get("flavor", ""))
    sizes = _LLAMA3_FLAVORS.get(flavor) if name == "llama3" else None
    if sizes is None:
        return None
    flag = f'[model] flavor "{flavor}"'
    blocks, hidden, heads, kv_heads = (Stated(n, flag) for n in sizes)
    return ModelSays(blocks=blocks, hidden=hidden, heads=heads, kv_heads=kv_heads)


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
    if not isinstance(mode, str):
        raise ValueError(
            f"{source}: activation_checkpoint mode = {mode!r}: use one of "
            + ", ".join(RECOMPUTE_MODES.values())
        )
    pattern = None
    if mode == "selective":
        mode, pattern = _layer_sac(ac.get("selective_ac_option", "2"), source)
    fp8 = "float8" in _names(model.get("converters"), "converters", source)
    # torch.compile: `[compile] enable` (torchtitan >= 0.2), `[training] compile` before;
    # Async TP: `[compile]` (>= 0.3) or `[parallelism] enable_async_tensor_parallel`
    compiled = _switch(comp, "enable", _switch(tr, "compile", False, source), source)
    key = "enable_async_tensor_parallel"
    async_tp = _switch(comp, key, _switch(par, key, False, source), source)
    return from_values(
        par,
        tr,
        mode,
        world_size=world_size,
        source=source,
        fp8=fp8,
        compiled=compiled,
        async_tp=async_tp,
        pattern=pattern,
        model_says=_flavor_says(model),
    )


def _layer_sac(option: object, source: str) -> tuple[str, RecomputePattern | None]:
    """torchtitan <= 0.2's `selective_ac_option` (its default "2") as the mode it amounts to
    and the blocks it recomputes: "op" is per-operator SAC (mode "selective"); an integer N
    checkpoints each block whose count is a multiple of N, every block for 0 or 1 (mode
    "full"; `_apply_layer_sac`, torchtitan/distributed/activation_checkpoint.py, v0.2.0)."""
    if str(option) == "op":
        return "selective", None
    try:
        every = int(str(option))
    except ValueError:
        every = -1
    if every < 0:
        raise ValueError(
            f"{source}: selective_ac_option {option!r}: use 'op' (per-operator checkpointing) "
            "or a whole number N (every Nth block checkpointed)"
        )
    if every <= 1:
        return "full", None
    return "per_layer", RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, every)


def _shown(value: Any) -> str:
    """A configuration's value as TOML writes it (`true`, `"x"`, `2.5`), else Python's repr."""
    return json.dumps(value) if isinstance(value, str | int | float | bool) else repr(value)


def _whole(value: Any, key: str, source: str, *, auto: bool = False) -> int:
    """A whole number >= 1 of the configuration (or -1, torchtitan's "the rest", where `auto`);
    ValueError naming the key otherwise (a fraction or a boolean would be read as another
    number, a zero degree would divide by zero)."""
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (value >= 1 or (auto and value == -1))
    )
    if not ok:
        rest = " or -1 (the rest)" if auto else ""
        raise ValueError(f"{source}: {key} = {_shown(value)} must be a whole number >= 1{rest}")
    return int(value)


def _switch(table: dict[str, Any], key: str, default: bool, source: str) -> bool:
    """A true/false key of the configuration; ValueError naming it when it is anything else
    (a string such as "no" would read as true)."""
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} = {_shown(value)} must be true or false")
    return value


def _names(value: Any, key: str, source: str, *, nested: bool = False) -> list[Any]:
    """A list of names (`nested`: a list of lists of names) of the configuration, [] when
    absent; ValueError naming the key otherwise."""
    if value is None:
        return []
    rows = value if isinstance(value, list) else None
    ok = rows is not None and all(
        (isinstance(r, list) and all(isinstance(n, str) for n in r))
        if nested
        else isinstance(r, str)
        for r in rows
    )
    if not ok:
        what = "a list of lists of module names" if nested else "a list of names"
        raise ValueError(f"{source}: {key} = {value!r} must be {what}")
    return list(value)


def _split(par: dict[str, Any], source: str) -> CountSplit:
    """`CountSplit.of_torchtitan`, its errors naming the file."""
    try:
        return CountSplit.of_torchtitan(par)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


_RESHARD = ("default", "always", "never")
"""torchtitan's `fsdp_reshard_after_forward` values."""
_DTYPES = ("float32", "bfloat16", "float16")
"""torchtitan's dtype names (`TORCH_DTYPE_MAP`)."""


def _choice(
    table: dict[str, Any], key: str, default: str, allowed: tuple[str, ...], source: str
) -> str:
    """One of `allowed` (a misspelt dtype would be read as another precision)."""
    value = table.get(key, default)
    if value not in allowed:
        raise ValueError(f"{source}: {key} = {_shown(value)}: use one of {', '.join(allowed)}")
    return str(value)


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
    built = getattr(getattr(config, "model_spec", None), "model", None)  # the model's config
    flag = "its model"
    layers, dim = getattr(built, "layers", None), getattr(built, "dim", None)
    says = ModelSays(
        blocks=Stated(len(layers), flag) if isinstance(layers, list | tuple) else None,
        hidden=Stated(dim, flag) if isinstance(dim, int) else None,
    )
    return from_values(
        par,
        tr,
        mode,
        world_size=world_size,
        source=f"torchtitan:{name}",
        fp8=fp8,
        compiled=compiled,
        async_tp=async_tp,
        model_says=says,
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
    pattern: RecomputePattern | None = None,
    model_says: ModelSays | None = None,
) -> TrainerSetup:
    """torchtitan's parallelism/training/activation-checkpoint values (its defaults where a
    key is absent) in the planner's terms; `fp8`: Float8 linear layers are on; `compiled`:
    torch.compile is, `async_tp`: with Async TP (the runtime: torchtitan-compile's or
    torchtitan-async-tp's preset, else torchtitan's)."""
    notes: list[str] = []

    def whole(table: dict[str, Any], key: str, default: int, *, auto: bool = False) -> int:
        return _whole(table.get(key, default), key, source, auto=auto)

    tp, pp = whole(par, "tensor_parallel_degree", 1), whole(par, "pipeline_parallel_degree", 1)
    cp, ep = whole(par, "context_parallel_degree", 1), whole(par, "expert_parallel_degree", 1)
    replicate = whole(par, "data_parallel_replicate_degree", 1)
    shard = whole(par, "data_parallel_shard_degree", -1, auto=True)
    if shard == -1:  # torchtitan: the ranks left over after the other axes
        shard = world_size // (replicate * tp * pp * cp)
    if min(tp, pp, cp, ep, replicate, shard) < 1 or replicate * shard * tp * pp * cp != world_size:
        raise ValueError(
            f"{source}: replicate {replicate} x shard {shard} x tp {tp} x pp {pp} x cp {cp} "
            f"does not use the cluster's {world_size} GPUs; set the degrees so their product "
            f"is {world_size} (or give the matching --cluster)"
        )
    dp = replicate * shard
    reshard = _choice(par, "fsdp_reshard_after_forward", "default", _RESHARD, source)
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
        key = "module_fqns_per_model_part"
        parts = _names(par.get(key), key, source, nested=True)
        if parts:
            vstages = len(parts) // pp
        elif schedule in _LOOPED and not par.get("pipeline_parallel_layers_per_stage"):
            vstages = _LOOPED_DEFAULT_STAGES
            notes.append(f"no module_fqns_per_model_part: {vstages} stages per rank assumed")
    if cp > 1:  # torchtitan's default exchanges K/V by all-gather (its job config, v0.2.0)
        rotate = par.get("context_parallel_rotate_method", "allgather")
        notes.append(
            f"context_parallel_rotate_method {rotate!r} priced as the ring (K/V passed around "
            "under the attention compute)"
        )
    local = whole(tr, "local_batch_size", 8)
    mbs = whole(par, "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    glob = whole(tr, "global_batch_size", -1, auto=True)
    glob = local * dp if glob <= 0 else glob
    if pp > 1 and glob > local * dp:
        notes.append(
            f"{glob // (local * dp)} accumulated pipeline passes evaluated as one pass of all "
            "micro-batches (one fill and drain instead of several)"
        )
    policy = {v: k for k, v in RECOMPUTE_MODES.items()}.get(mode)
    if pattern is not None:  # torchtitan's own blocks, priced as per_layer policies
        policy = Recompute.PER_LAYER
        notes.append(f"selective_ac_option = {pattern.count}: {pattern.describe()}")
    if policy is None:
        raise ValueError(
            f"{source}: activation checkpoint mode {mode!r} has no paraplan model; use "
            + ", ".join(RECOMPUTE_MODES.values())
        )
    dtype = _choice(tr, "dtype", "float32", _DTYPES, source)
    param = _choice(tr, "mixed_precision_param", "bfloat16", _DTYPES, source)
    if dtype == "bfloat16":
        notes.append("pure bf16 training (no fp32 master weights) evaluated as bf16 mixed")
    precision = (
        Precision.BF16
        if "bfloat16" in (dtype, param)
        else Precision.FP16
        if "float16" in (dtype, param)
        else Precision.FP32
    )
    if fp8 and precision == Precision.BF16:
        precision = Precision.FP8
    offload = _switch(tr, "enable_cpu_offload", False, source) and zero > 0
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
        sequence_parallel=tp > 1 and _switch(par, "enable_sequence_parallel", True, source),
        schedule=schedule,
        virtual_stages=vstages,
        micro_batch_size=mbs,
        recompute=policy,
    )
    setup = TrainerSetup(
        target=Target.TORCHTITAN,
        strategy=strategy,
        global_batch=glob,
        seq_len=whole(tr, "seq_len", 2048),
        precision=precision,
        notes=tuple(notes),
        runtime=torchtitan_framework(compiled=compiled, async_tp=async_tp),
        split=_split(par, source) if pp > 1 else None,
        pattern=pattern,
        model_says=model_says,
    )
    return check_batch(setup)
