"""`run_plan`: launch a training script under torchrun with the plan's world size.

Kept free of torch imports (the CLI imports it); the plan path reaches the script through the
PARAPLAN_PLAN environment variable, as the examples read it. Before any rank starts, the
launcher checks what it can without torch (`check_before_launch`): the plan file, what the
executor runs (planner/capabilities.py), one node, the devices (GPUs the driver lists for a GPU
plan) and, when the script declares its model as ``--model CONFIG.json`` (the examples do),
that the config's architecture is the plan's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..planner.capabilities import plan_gaps
from ..planner.inputs import read_json
from ..planner.plan import Plan
from ..planner.plan_io import load_plan

PLAN_ENV = "PARAPLAN_PLAN"
"""Environment variable holding the plan path for the launched script."""


def torchrun_command(
    plan_path: str | os.PathLike[str], script: str, script_args: Sequence[str] = ()
) -> list[str]:
    """The torchrun command line for `script` under the plan (validated on the way)."""
    plan = load_plan(plan_path)
    if not Path(script).is_file():
        raise ValueError(f"training script {script!r} does not exist; give a path to a .py file")
    if plan.cluster.num_nodes > 1:
        raise ValueError(
            f"the plan spans {plan.cluster.num_nodes} nodes; run_plan launches one node "
            f"(--standalone): start torchrun on each node with --nnodes={plan.cluster.num_nodes} "
            f"--nproc-per-node={plan.cluster.gpus_per_node} and {PLAN_ENV}={plan_path}"
        )
    check_before_launch(plan, script_args)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={plan.cluster.num_gpus}",
        script,
        *script_args,
    ]


def run_plan(
    plan_path: str | os.PathLike[str], script: str, script_args: Sequence[str] = ()
) -> int:
    """Run `script script_args...` under torchrun with one process per planned device and
    PARAPLAN_PLAN set to the plan; returns torchrun's exit status."""
    cmd = torchrun_command(plan_path, script, script_args)
    env = {**os.environ, PLAN_ENV: str(Path(plan_path).resolve())}
    return subprocess.run(cmd, env=env, check=False).returncode


NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")
"""One entry per GPU the NVIDIA driver has loaded (Linux), read without CUDA or torch."""
CONFIG_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("num_blocks", ("num_hidden_layers", "n_layer")),
    ("hidden", ("hidden_size", "n_embd")),
    ("heads", ("num_attention_heads", "n_head")),
    ("kv_heads", ("num_key_value_heads",)),
    ("vocab", ("vocab_size",)),
    ("experts", ("num_local_experts", "num_experts", "n_routed_experts")),
)
"""Plan model fields and the Hugging Face config keys (Llama/Mixtral, GPT-2) that hold them."""


def visible_gpus() -> int:
    """GPUs this process may use: the driver's list, limited by CUDA_VISIBLE_DEVICES."""
    found = len(list(NVIDIA_GPUS_DIR.iterdir())) if NVIDIA_GPUS_DIR.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([d for d in visible.split(",") if d.strip()]))
    return found


def check_before_launch(plan: Plan, script_args: Sequence[str] = ()) -> None:
    """Refuse, before any rank starts, a plan this machine or the executor cannot run, or
    one made for another model than the script's ``--model`` config. Raises ValueError."""
    gaps = plan_gaps(plan)
    if gaps:
        raise ValueError(f"the executor cannot run this plan: {gaps[0]}")
    if plan.cluster.accelerator != "cpu":
        gpus = visible_gpus()
        if gpus < plan.cluster.gpus_per_node:
            raise ValueError(
                f"the plan is for {plan.cluster.gpus_per_node} {plan.cluster.accelerator} GPUs "
                f"per node but this machine shows {gpus}; run it where the GPUs are, or re-plan "
                f"for this machine (--cluster {gpus}x<gpu>, or <N>xcpu for a CPU run)"
            )
    config = _model_arg(script_args)
    if config is not None:
        check_config_matches(plan, config)


def _model_arg(args: Sequence[str]) -> str | None:
    """The value of ``--model X`` / ``--model=X`` when X is a JSON file."""
    for i, arg in enumerate(args):
        value = None
        if arg == "--model" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--model="):
            value = arg.partition("=")[2]
        if value is not None and value.endswith(".json") and Path(value).is_file():
            return value
    return None


def check_config_matches(plan: Plan, config_path: str) -> None:
    """The Hugging Face config's architecture (depth, width, heads, vocabulary, experts) must
    be the one the plan was made for."""
    config = read_json(config_path, what="model config", hint="pass a Hugging Face config.json")
    if not isinstance(config, dict):
        return
    for field, keys in CONFIG_FIELDS:
        found = next((config[k] for k in keys if config.get(k) is not None), None)
        if field == "kv_heads" and found is None:  # no GQA key: one K/V head per head
            found = next((config[k] for k in CONFIG_FIELDS[2][1] if k in config), None)
        if field == "experts" and found is None:
            found = 0
        planned = getattr(plan.model, field)
        if found is not None and found != planned:
            raise ValueError(
                f"model fingerprint mismatch: the script's --model {config_path} has "
                f"{field}={found} but the plan was made for {plan.model.name!r} with "
                f"{field}={planned}; re-plan with --model {config_path}, or pass the config the "
                "plan was made from"
            )
