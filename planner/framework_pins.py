"""A search for a framework (`paraplan plan --runtime`): the user's pins checked against what
that framework runs (`frameworks.FrameworkSpace`), and its missing options pinned off, before
any tracing or search."""

from __future__ import annotations

from dataclasses import replace

from .cluster import Cluster
from .config import Runtime
from .frameworks import FrameworkSpace, space_of
from .options import Consent
from .pins import Pins
from .strategy import Recompute, Schedule

_DROP = "drop it from --fix, or plan for another --runtime"


def refuse_framework_cluster(cluster: Cluster, runtime: Runtime) -> None:
    """ValueError when a plan for `runtime`'s framework is asked on a cluster it cannot run on:
    the trainers priced (torchtitan, Megatron-LM, NeMo) train on GPUs, not on the host's CPUs."""
    space = space_of(runtime)
    if space is not None and cluster.accelerator.is_host:
        raise ValueError(
            f"--runtime {space.name} on cluster {cluster.name!r}: {space.name} trains on GPUs, "
            "and this cluster's devices are CPUs; plan for a GPU cluster, or leave out --runtime "
            "(paraplan's executor runs on CPUs)"
        )


def framework_pins(pins: Pins | None, runtime: Runtime, consent: Consent) -> Pins | None:
    """`pins` for a search priced for `runtime`'s framework: unchanged for paraplan's executor
    (and an API caller's own runtime); else with the options the framework lacks pinned off
    (parameter and activation offload). ValueError naming the pin or option the framework
    does not run."""
    space = space_of(runtime)
    return pins if space is None else space_pins(pins, space, consent)


def space_pins(pins: Pins | None, space: FrameworkSpace, consent: Consent) -> Pins:
    """`framework_pins` for a framework's `space`."""
    pins = pins or Pins()
    problem = _pinned_outside(pins, space) or _consent_outside(consent, space)
    if problem is not None:
        raise ValueError(f"--runtime {space.name}: {problem}")
    return replace(
        pins,
        offload_params=pins.offload_params if space.offload_params else False,
        offload_activations=False,
    )


def _pinned_outside(pins: Pins, space: FrameworkSpace) -> str | None:
    """Why a pin asks for what `space` does not run, or None."""
    name = space.name
    if pins.schedule not in (None, Schedule.NONE) and pins.schedule not in space.schedules:
        runs = ", ".join(sorted(str(s) for s in space.schedules))
        return f"schedule={pins.schedule} is not a schedule {name} runs ({runs}); {_DROP}"
    if pins.zero_stage is not None and pins.zero_stage not in space.zero_stages:
        runs = ", ".join(str(z) for z in sorted(space.zero_stages))
        return f"zero={pins.zero_stage} is not a ZeRO stage {name} runs ({runs}); {_DROP}"
    if pins.recompute == Recompute.PER_LAYER and not space.per_layer_recompute:
        return f"recompute=per_layer: {name} runs one recompute policy for every block; {_DROP}"
    hsdp = pins.dp_shard is not None and (pins.dp is None or pins.dp_shard < pins.dp)
    if hsdp and not space.hsdp:
        return f"dp_shard={pins.dp_shard}: {name} has no HSDP (shard groups within dp); {_DROP}"
    if pins.offload_params and not space.offload_params:
        return f"offload_params=true: {name} has no parameter offload; {_DROP}"
    if pins.offload_activations:
        return f"offload_activations=true: {name} has no activation offload priced; {_DROP}"
    if pins.powersgd_rank is not None:
        return f"powersgd={pins.powersgd_rank}: {name} has no PowerSGD; {_DROP}"
    if pins.async_pipeline:
        return f"async_pipeline=true: {name} has no asynchronous pipeline; {_DROP}"
    return None


def _consent_outside(consent: Consent, space: FrameworkSpace) -> str | None:
    """Why an offered option is one `space` does not run, or None."""
    if consent.compression:
        return f"--allow-compression: {space.name} has no PowerSGD; leave it out"
    if consent.async_pipeline:
        return f"--allow-async: {space.name} has no asynchronous pipeline; leave it out"
    return None


def mtp_pins(pins: Pins | None, runtime: Runtime, mtp_layers: int) -> Pins | None:
    """`pins` for a search that trains `mtp_layers` multi-token-prediction modules: torchtitan
    trains them without pipeline or context parallelism (its MTPDecoder raises
    NotImplementedError for either, torchtitan 0.3.0 models/deepseek_v3/mtp.py), so both are
    pinned to 1 there; ValueError for a pin above 1."""
    space = space_of(runtime)
    if not mtp_layers or space is None or not space.name.startswith("torchtitan"):
        return pins
    pins = pins or Pins()
    for name in ("pp", "cp"):
        value = getattr(pins, name)
        if value is not None and value > 1:
            raise ValueError(
                f"--fix {name}={value} with {mtp_layers} multi-token-prediction module(s) on "
                f"--runtime {space.name}: torchtitan trains them without pipeline or context "
                "parallelism; drop the pin, plan --mtp-layers 0, or --runtime megatron or nemo"
            )
    return replace(pins, pp=1, cp=1)
