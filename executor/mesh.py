"""The process group and the DeviceMesh a plan asks for.

The mesh has the plan's axes (`MeshAxis` names, outermost first) and sizes, so rank r sits at
the coordinates the planner assumed (the last axis varies fastest, as in `init_device_mesh`).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..planner.plan import Plan
from ..planner.strategy import MeshAxis

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a collective waits for a peer before raising: a rank that dies or hangs makes the
others fail within this bound instead of hanging (NCCL and gloo honour the group timeout)."""


def job_world_size() -> int:
    """World size of the running job, read without any collective: the process group when it
    exists, else torchrun's WORLD_SIZE (1 for a plain `python` process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"WORLD_SIZE={raw!r} is not an integer; launch with torchrun") from None


def plan_device_type(plan: Plan) -> str:
    """``cpu`` for plans made for the catalog's ``cpu`` accelerator, else ``cuda``."""
    return "cpu" if plan.cluster.accelerator == "cpu" else "cuda"


def init_distributed(device_type: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Start the default process group (gloo on CPU, NCCL on CUDA) with a bounded timeout,
    unless it exists; on CUDA, bind this process to its LOCAL_RANK device first. Under torchrun
    the group meets at MASTER_ADDR; without it (a plain `python` process) it is a group of one.
    Reads the environment, never writes it."""
    if dist.is_initialized():
        return
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if device_type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_ADDR" not in os.environ:
        # A plain single-process run: an in-process store, no port and no environment writes.
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
        return
    dist.init_process_group(backend=backend, timeout=timeout)


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """The plan's DeviceMesh (a collective: every rank must call it)."""
    names = tuple(str(a) for a in plan.mesh.axis_order)  # torch takes plain strings
    return init_device_mesh(device_type, tuple(plan.mesh.shape), mesh_dim_names=names)


def axis_size(mesh: DeviceMesh, axis: MeshAxis) -> int:
    """Size of a mesh axis (1 when the mesh lacks it)."""
    names = mesh.mesh_dim_names or ()
    return mesh.size(names.index(str(axis))) if str(axis) in names else 1


def axis_rank(mesh: DeviceMesh, axis: MeshAxis) -> int:
    """This rank's coordinate along a mesh axis (0 when the mesh lacks it)."""
    names = mesh.mesh_dim_names or ()
    return mesh.get_local_rank(str(axis)) if str(axis) in names else 0


def check_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """A caller's mesh must have the plan's axes, in order, and sizes."""
    names, shape = tuple(mesh.mesh_dim_names or ()), tuple(mesh.shape)
    planned = tuple(str(a) for a in plan.mesh.axis_order)
    if names != planned or shape != tuple(plan.mesh.shape):
        raise ValueError(
            f"mesh {names} {shape} is not the plan's {planned} "
            f"{tuple(plan.mesh.shape)}; pass mesh=None to build the plan's"
        )
    return mesh


def local_device(device_type: str) -> torch.device:
    """This process's device: its CUDA device (set by `init_distributed`), or the CPU."""
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def split_axis(
    mesh: DeviceMesh, axis: MeshAxis, sizes: tuple[int, ...], names: tuple[str, ...]
) -> DeviceMesh:
    """The plan's mesh with `axis` laid out as `sizes` (outermost first) named `names`, e.g.
    dp as (replicate, shard) for HSDP or (replicas, ep) for expert parallelism. The result
    derives from the same root mesh, so DTensors on it combine with the others' (FSDP x TP).
    A collective: every rank calls it with the same arguments (it creates the groups)."""
    return mesh._unflatten(str(axis), sizes, names)


def flatten_axes(mesh: DeviceMesh, names: tuple[str, ...], name: str) -> DeviceMesh:
    """The axes `names` of `mesh` as one axis `name` (taken in the mesh's order, the last
    fastest), e.g. dp and cp as the data-parallel group under context parallelism. A
    collective, as `split_axis`."""
    order = [n for n in (mesh.mesh_dim_names or ()) if n in names]
    if len(order) == 1:
        return mesh[order[0]]
    return mesh[tuple(order)]._flatten(name)
