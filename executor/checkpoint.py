"""Save and resume training state with `torch.distributed.checkpoint` (DCP).

A checkpoint is a folder ``<dir>/step-<n>`` (n = optimizer steps done) written by every rank
in parallel: the model and optimizer state dicts of this rank's chunks under plan-independent
names (DCP's `get_model_state_dict` strips FSDP/DDP wrappers; optimizer states are flattened
per parameter name, as torchtitan does), plus the step. Rank 0 then writes ``<dir>/latest``
(atomically), so a run killed while saving resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..planner.inputs import read_text
from ..planner.jsonio import write_atomic
from .compose import ParallelModel
from .optim import Optimizers

LATEST = "latest"
"""File naming the newest complete checkpoint folder."""
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
_STEP_FOLDER = re.compile(r"step-[0-9]{1,18}")
"""What `latest` may name: a folder ``step-<n>`` (n optimizer steps done) beside it."""
_MARKER_BYTES = 256
"""Largest `latest` file read (it holds one short folder name)."""


def _model_state(pm: ParallelModel) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for part in pm.parts:
        state.update(get_model_state_dict(part))
    return state


def _optim_state(pm: ParallelModel, opts: Optimizers) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for part, opt in zip(pm.parts, opts.optimizers, strict=True):
        state.update(get_optimizer_state_dict(part, opt, options=_FLAT))
    return state


def save_checkpoint(
    pm: ParallelModel, opts: Optimizers, folder: str | os.PathLike[str], *, step: int
) -> Path:
    """Write the training state after `step` optimizer steps (collective); returns the path."""
    root = Path(folder)
    target = root / f"step-{step}"
    state = {"model": _model_state(pm), "optim": _optim_state(pm, opts), "train": {"step": step}}
    dcp.save(state, checkpoint_id=str(target))
    dist.barrier()
    if dist.get_rank() == 0:
        write_atomic(root / LATEST, target.name + "\n")
    dist.barrier()
    return target


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint in `folder`, or None when there is no `latest` marker.

    A checkpoint folder is trusted input (DCP unpickles its metadata: loading one runs code),
    so the marker may only point at a ``step-<n>`` folder inside `folder`, symbolic links
    resolved; anything else is a ValueError naming the marker, what it says and the rule."""
    root = Path(folder)
    marker = root / LATEST
    if not os.path.lexists(marker):
        return None
    hint = f"it holds the name of a step-<n> folder in {str(root)!r}; delete it to start afresh"
    name = read_text(marker, what="checkpoint marker", hint=hint, max_bytes=_MARKER_BYTES).strip()
    if not _STEP_FOLDER.fullmatch(name):
        raise ValueError(
            f"checkpoint marker {str(marker)!r} names {name[:80]!r}, not a step-<n> folder; {hint}"
        )
    target = root / name
    if not target.resolve().is_relative_to(root.resolve()):
        raise ValueError(
            f"checkpoint marker {str(marker)!r} leads to {str(target.resolve())!r}, outside "
            f"{str(root)!r} (a symbolic link out of the checkpoint folder); a resumed run loads "
            f"only checkpoints inside --checkpoint-dir; {hint}"
        )
    return target


def load_checkpoint(pm: ParallelModel, opts: Optimizers, path: str | os.PathLike[str]) -> int:
    """Load a checkpoint into the parallelized model and its optimizers (collective; the
    plan must have the same chunks as the one that saved); returns the steps done."""
    if not Path(path).is_dir():
        raise ValueError(f"checkpoint {str(path)!r} does not exist; pass a step-<n> folder")
    state = {"model": _model_state(pm), "optim": _optim_state(pm, opts), "train": {"step": -1}}
    dcp.load(state, checkpoint_id=str(path))
    for part in pm.parts:
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
    for part, opt in zip(pm.parts, opts.optimizers, strict=True):
        set_optimizer_state_dict(part, opt, optim_state_dict=state["optim"], options=_FLAT)
    return int(state["train"]["step"])
