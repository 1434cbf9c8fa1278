"""The public Python API (thin: the planner does the work)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .planner.api import PlanOutcome
    from .planner.cluster import Cluster
    from .planner.model import ModelProfile
    from .planner.model_spec import TransformerSpec
    from .planner.pins import Pins


def model_profile(
    model: str,
    *,
    seq_len: int | None,
    precision: str = "bf16",
    source: str = "auto",
    progress: bool = False,
    notes: list[str] | None = None,
) -> ModelProfile:
    """The planner's view of `--model`: a Hugging Face preset or config.json traced on the meta
    device (source "trace"; needs torch), or an analytic spec (source "spec": a preset,
    'family:key=value,...' or a spec file). "auto" traces Hugging Face models and falls back to
    the analytic spec of the same preset when tracing is impossible (the reason goes to
    `notes`)."""
    from . import profile_cache
    from .planner.hf_presets import is_hf_model
    from .planner.model_parse import parse_model
    from .planner.model_spec import PRESETS

    if source not in ("auto", "spec", "trace"):
        raise ValueError(f"model source {source!r} must be auto, spec or trace")
    act_bytes = 4 if precision == "fp32" else 2
    if source == "trace" or (source == "auto" and is_hf_model(model)):
        if not is_hf_model(model):
            raise ValueError(
                f"--model {model!r}: tracing needs a Hugging Face preset or config.json "
                "(with model_type); use --model-source spec for a transformer by its sizes"
            )
        hit = profile_cache.lookup(model, seq_len=seq_len, precision=precision)
        if hit is not None:  # traced before with the same config, versions and profiler
            return hit
        try:
            import torch

            from .executor.convert import executed_module
            from .profiler.hf import profile_hf
        except ImportError as exc:  # torch not installed: the planner alone still works
            if source == "trace" or model.lower() not in PRESETS:
                raise ValueError(f"tracing {model!r} needs torch and transformers: {exc}") from None
            if notes is not None:
                notes.append(f"torch unavailable ({exc}); planned from the analytic spec")
        else:
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            try:
                traced = profile_hf(
                    model,
                    seq_len=seq_len,
                    dtype=dtype,
                    progress=progress,
                    as_run=executed_module,  # priced as the executor runs it
                )
                profile_cache.store(model, traced, seq_len=seq_len, precision=precision)
                return traced
            except ValueError as exc:
                if source == "trace" or model.lower() not in PRESETS:
                    raise
                if notes is not None:
                    notes.append(f"tracing failed ({exc}); planned from the analytic spec")
    spec = parse_model(model)
    return spec.to_profile(spec.seq if seq_len is None else seq_len, act_bytes=act_bytes)


def plan(
    model: str | TransformerSpec | ModelProfile,
    cluster: str | Cluster,
    *,
    global_batch: int,
    seq_len: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    memory_headroom: float = 0.1,
    fix: str | Pins | None = None,
    top_k: int = 3,
    gpus_per_node: int | None = None,
    progress: Callable[[float], None] | None = None,
    any_engine: bool = False,
    model_source: str = "auto",
    allow_compression: bool = False,
    allow_async: bool = False,
    runtime: str = "paraplan",
    recompute_modules: str | None = None,
    ep_dispatch: str | None = None,
    mtp_layers: int | None = None,
) -> PlanOutcome:
    """Plan `model` (a preset/spec string, a `TransformerSpec` or a `ModelProfile`) on
    `cluster` (e.g. ``"8xh100"`` or a `Cluster`), with `fix` pins (`--fix` text or `Pins`).
    Only plans the executor runs are returned unless `any_engine` (planner/capabilities.py)
    or `runtime` names another framework than "paraplan" (torchtitan, torchtitan-compile,
    torchtitan-async-tp, megatron, nemo: planner/frameworks.py), whose runtime the plan is
    then priced for; `recompute_modules` ("layernorm,moe_act") what Megatron's and NeMo's
    selective recompute redoes (`--recompute-modules`; default their attention core), or
    "auto": the faster plan of each of `frameworks.MODULE_CHOICES`; `ep_dispatch` how MoE
    tokens reach their experts ("alltoall", "hierarchical": `config.EpDispatch`; default the
    runtime's); `mtp_layers` the multi-token-prediction modules trained after the blocks
    (default: the model's own where the runtime's recipes train them, NeMo's; else none).
    PowerSGD (`allow_compression`) and the asynchronous PipeDream-2BW pipeline
    (`allow_async`) change the training math and are searched only when allowed.
    A model string is read as the CLI reads `--model`: `model_source` "auto" (the default of
    both) traces Hugging Face presets and configs, "spec" uses the analytic spec.
    Raises ValueError on bad input and `NoFeasiblePlanError` (a ValueError) when nothing
    fits."""
    from .planner.api import NoFeasiblePlanError, make_plan
    from .planner.cluster import Cluster, parse_cluster
    from .planner.config import EpDispatch, TrainConfig
    from .planner.frameworks import RUNTIMES, module_choices, parse_framework
    from .planner.frameworks import mtp_layers as mtp_of
    from .planner.model import ModelProfile
    from .planner.model_spec import TransformerSpec
    from .planner.options import Consent
    from .planner.pins import Pins

    framework = parse_framework(runtime)  # a bad name fails before any tracing
    chosen = RUNTIMES[framework]
    choices = module_choices(recompute_modules, framework, allow_auto=True)  # and a bad list
    mtp_of(mtp_layers, 0, framework, any_engine)  # and a bad count
    if ep_dispatch is not None:
        try:
            chosen = replace(chosen, ep_dispatch=EpDispatch(ep_dispatch))
        except ValueError:
            named = ", ".join(d.value for d in EpDispatch)
            raise ValueError(
                f"ep_dispatch={ep_dispatch!r} is not a dispatcher; use {named}"
            ) from None
    spec: TransformerSpec | ModelProfile | str
    if isinstance(model, str):
        spec = model_profile(model, seq_len=seq_len, precision=precision, source=model_source)
    else:
        spec = model
    if isinstance(spec, TransformerSpec):
        seq = spec.seq if seq_len is None else seq_len
        profile = spec.to_profile(seq, act_bytes=2 if precision != "fp32" else 4)
    elif isinstance(spec, ModelProfile):
        profile, seq = spec, spec.seq_len if seq_len is None else seq_len
    else:
        raise ValueError(
            f"model={model!r}: expected a preset or spec string, a TransformerSpec or a "
            "ModelProfile"
        )
    if isinstance(cluster, Cluster):
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node applies to a cluster string; the Cluster has its own")
        cl = cluster
    else:
        cl = parse_cluster(cluster, gpus_per_node=gpus_per_node)
    train = TrainConfig(
        global_batch=global_batch,
        seq_len=seq,
        precision=precision,  # type: ignore[arg-type]
        optimizer=optimizer,
        memory_headroom=memory_headroom,  # type: ignore[arg-type]
        runtime=chosen,
        mtp_layers=mtp_of(mtp_layers, profile.mtp_modules, framework, any_engine),
    )
    pins = Pins.parse(fix) if isinstance(fix, str) else fix
    if len(choices) > 1:  # `auto`: a MoE model's search also weighs its whole MoE layer
        choices = module_choices(recompute_modules, framework, allow_auto=True, moe=profile.is_moe)
    consent = Consent(compression=allow_compression, async_pipeline=allow_async)
    outcomes: list[PlanOutcome] = []
    refused: list[NoFeasiblePlanError] = []
    for i, modules in enumerate(choices):  # one search per module list; the faster plan wins
        share = None if progress is None else _share(progress, i, len(choices))
        try:
            outcomes.append(
                make_plan(
                    profile,
                    cl,
                    replace(train, runtime=replace(chosen, recompute_modules=modules)),
                    pins=pins,
                    top_k=top_k,
                    progress=share,
                    any_engine=any_engine,
                    consent=consent,
                )
            )
        except NoFeasiblePlanError as exc:
            refused.append(exc)
    if not outcomes:  # every list refused (there is at least one): the first one's reason
        raise refused[0]
    return min(outcomes, key=lambda o: (not o.plan.feasible, o.plan.predicted.step_time_s))


def _share(progress: Callable[[float], None], i: int, n: int) -> Callable[[float], None]:
    """`progress` for the i-th of n searches run one after the other."""
    return lambda fraction: progress((i + fraction) / n)


def detect_cluster() -> Cluster:
    """The running job as a cluster: world size and GPUs per node from torchrun's environment
    (WORLD_SIZE, LOCAL_WORLD_SIZE), the accelerator from the CUDA device name, else `cpu`."""
    import os

    import torch

    from .planner.cluster import make_cluster
    from .planner.hardware import accelerator_for_device_name

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        memory = torch.cuda.get_device_properties(0).total_memory
        found = accelerator_for_device_name(name, memory_bytes=memory)
        if found is None:
            raise ValueError(
                f"GPU {name!r} is not in the accelerator catalog; pass cluster='<N>x<name>' or a "
                "Cluster with calibrated figures"
            )
        acc = found
    else:
        acc = "cpu"
    return make_cluster(acc, world, gpus_per_node=local)


def auto_parallelize(
    model: Any,
    example_inputs: Any,
    *,
    global_batch: int,
    cluster: str | Cluster | None = None,
    fix: str | Pins | None = None,
    loss_fn: Callable[..., Any] | None = None,
    **parallelize_kwargs: Any,
) -> Any:
    """Profile -> plan -> parallelize in one call, inside a torchrun process: returns the
    executor's `ParallelModel` (its `.plan` is the plan chosen).

    `example_inputs` is one batch for the profiler (batch first, e.g. a Hugging Face kwargs
    dict with labels); `cluster` defaults to the running job (`detect_cluster`). The profile
    uses counted FLOPs and bytes, not timings, so every rank plans the same thing. Context and
    expert parallelism are pinned to 1 (the executor does not run them yet)."""
    import torch

    from .executor import parallelize
    from .planner.pins import Pins
    from .profiler import profile as run_profile

    prof = run_profile(model, example_inputs, loss_fn=loss_fn, measured_on="", repeats=0, warmup=0)
    model.zero_grad(set_to_none=True)
    dtype = next(model.parameters()).dtype
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype, "fp32")
    pins = Pins.parse(fix) if isinstance(fix, str) else fix or Pins()
    pins = replace(pins, cp=1 if pins.cp is None else pins.cp, ep=1 if pins.ep is None else pins.ep)
    where = cluster if cluster is not None else detect_cluster()
    chosen = plan(prof, where, global_batch=global_batch, precision=precision, fix=pins, top_k=0)
    return parallelize(model, chosen.plan, **parallelize_kwargs)
