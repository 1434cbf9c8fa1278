"""`run_plan`: launch a training script under torchrun with the plan's world size.

Kept free of torch imports (the CLI imports it); the plan path reaches the script through the
PARAPLAN_PLAN environment variable, as the examples read it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

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
