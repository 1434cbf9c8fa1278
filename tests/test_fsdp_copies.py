"""FSDP2's own copies (`data_parallel.fsdp_copy_bytes`) against the operators torch really runs:
a fully_shard-ed stack on 2 gloo ranks, one forward and backward under a dispatch mode that
records the bytes each of FSDP2's copy operators writes. The formula's counts (two gathers per
ZeRO-3 unit, each with a copy-in of the shard and a copy-out of the whole unit, one
reduce-scatter copy-in of the unsharded gradients) must be what torch runs.

Run under torchrun (``tests/test_fsdp_copies.py OUT``) it is the worker."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from paraplan.planner.config import Precision, TrainConfig
from paraplan.planner.cost.data_parallel import fsdp_copy_bytes

ROOT = Path(__file__).resolve().parents[1]
WIDTH, UNITS = 256, 4
COPIES = ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat")


def _written(func_name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Bytes the copy operator wrote: the flat all-gather input (the shards copied in), the
    unsharded parameters (`out=` of the copy-out), the flat reduce-scatter input."""
    if func_name == "all_gather_copy_in":
        return int(out[0].numel() * out[0].element_size())
    target = kwargs.get("out", args[-1] if func_name == "split_with_sizes_copy" else None)
    tensors = target if isinstance(target, (list, tuple)) else [target]
    return sum(int(t.numel() * t.element_size()) for t in tensors if t is not None)


def _worker(out_dir: Path, bf16: bool, root: bool = False) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: Counter[str] = Counter()
            self.bytes: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func.overloadpacket.__name__)
            if name in COPIES:
                self.calls[name] += 1
                self.bytes[name] += _written(name, args, kwargs, out)
            return out

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    torch.manual_seed(0)
    blocks = [nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(UNITS)]
    # `root`: a head of the root unit's own, as the executor's chain keeps its embedding and
    # head in the root
    model = nn.Sequential(*blocks, *([nn.Linear(WIDTH, WIDTH, bias=False)] if root else []))
    for module in (*blocks, model):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    x = torch.randn(2, WIDTH)
    model(x).sum().backward()  # warm-up: lazy init
    for p in model.parameters():
        p.grad = None
    mode = Copies()
    with mode:
        model(x).sum().backward()
    if dist.get_rank() == 0:
        payload = {"calls": dict(mode.calls), "bytes": dict(mode.bytes)}
        name = "root.json" if root else "bf16.json" if bf16 else "fp32.json"
        (out_dir / name).write_text(json.dumps(payload))
    # both ranks done with FSDP's collectives before the group goes (a rank that tore it down
    # while its peer still ran aborted once in CI: "terminate called without an active
    # exception")
    del model, blocks, mode
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16])
def test_fsdp_copy_bytes_are_the_copies_fsdp2_runs(tmp_path: Path, precision: Precision) -> None:
    bf16 = precision == Precision.BF16
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [__file__, str(tmp_path), *(["bf16"] if bf16 else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads((tmp_path / ("bf16.json" if bf16 else "fp32.json")).read_text())
    calls, written = got["calls"], got["bytes"]
    # the structure the formula assumes: per unit two gathers (forward, backward: ZeRO-3
    # reshards after forward) and one reduce-scatter; the root unit holds no parameters
    assert calls == {"all_gather_copy_in": 2 * UNITS, "split_with_sizes_copy": 2 * UNITS,
                     "chunk_cat": UNITS}  # fmt: skip
    t = TrainConfig(global_batch=2, seq_len=1, precision=precision)
    unit = WIDTH * WIDTH
    # copy-out on the default stream: read and write the whole unit, per gather
    device_only = fsdp_copy_bytes(unit, 2, t, on_host=False) * UNITS
    assert device_only == 2 * written["split_with_sizes_copy"]
    # on a host CPU also the copy-ins: the shards (read and written; under bf16 after the
    # cast from the fp32 shard, read 4 B and written 2 B per element) and the gradients
    # (read in the working dtype, written in the fp32 reduce dtype)
    cast = written["all_gather_copy_in"] * (4 + 2) / 2 if bf16 else 0.0
    grads_read = written["chunk_cat"] * t.param_bytes / 4
    expected = (
        device_only + 2 * written["all_gather_copy_in"] + cast + written["chunk_cat"] + grads_read
    )
    assert fsdp_copy_bytes(unit, 2, t, on_host=True) * UNITS == pytest.approx(expected)


@pytest.mark.multiprocess
def test_fsdp2_regathers_the_blocks_not_the_root(tmp_path: Path) -> None:
    """What `dp_comm` prices for ZeRO-3's backward: the blocks are gathered again (they
    reshard after forward), the root unit (the executor's embedding and head) is not: it stays
    gathered from its forward, torch's default for the root, and backward starts with it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [__file__, str(tmp_path), "root"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    calls = json.loads((tmp_path / "root.json").read_text())["calls"]
    # forward: root + every block; backward: every block again; one reduce-scatter per unit
    assert calls["all_gather_copy_in"] == (UNITS + 1) + UNITS
    assert calls["chunk_cat"] == UNITS + 1


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), bf16=sys.argv[2:] == ["bf16"], root=sys.argv[2:] == ["root"])
