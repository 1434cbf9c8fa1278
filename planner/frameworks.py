"""The training frameworks a plan can be priced for (`paraplan plan --runtime`): each is a
`Runtime`, how that framework runs a step's kernels, as its sources and defaults say.

A plan is priced for one of them; paraplan's executor runs only its own (`PARAPLAN`), so a plan
priced for another is meant for `paraplan export` to that trainer, and `paraplan run` refuses
it (its measured-against-predicted comparison would read another framework's prices).
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from .config import AttentionKernel, Float8Casts, Runtime, SelectiveRecompute


class Framework(StrEnum):
    """A training framework paraplan prices (`runtime_of`)."""

    PARAPLAN = "paraplan"
    """paraplan's executor: eager PyTorch, torch SDPA, torch's sequence parallelism (keeps the
    gathered inputs), torch's cross-entropy, FSDP2 with the embedding and head in one root
    unit."""
    TORCHTITAN = "torchtitan"
    """torchtitan as configured by default (`training.compile` off): eager PyTorch, torch SDPA,
    per-operator selective checkpointing (`selective_ac_option = "op"`), FSDP2 units for the
    embedding, each block and norm + output apart, torchao's Float8Linear under fp8."""
    TORCHTITAN_COMPILE = "torchtitan-compile"
    """torchtitan with `--training.compile`: the elementwise operators fused by torch.compile
    (and torchao's fp8 casts with them); otherwise as `TORCHTITAN`."""
    MEGATRON = "megatron"
    """Megatron-LM (Megatron-Core with Transformer Engine): fused elementwise kernels and
    attention, the sequence shards kept for backward and gathered again, its fused
    vocabulary-parallel cross-entropy, Transformer Engine's fp8 Linear; TP communication on the
    critical path (`--tp-comm-overlap` is off by default)."""
    NEMO = "nemo"
    """NeMo's Megatron-Bridge performance recipes: `MEGATRON` with TP communication overlapped
    with the GEMMs (userbuffers, `tp_comm_overlap`)."""


_MEGATRON = Runtime(
    fused_elementwise=True,
    attention=AttentionKernel.FUSED,
    sp_saves_gathered_input=False,
    torch_loss=False,
    fp8_casts=Float8Casts.TRANSFORMER_ENGINE,
)
_TORCHTITAN = Runtime(selective=SelectiveRecompute.EVERY_OTHER_MATMUL, fsdp_shared_root=False)

RUNTIMES: dict[Framework, Runtime] = {
    Framework.PARAPLAN: Runtime(),
    Framework.TORCHTITAN: _TORCHTITAN,
    Framework.TORCHTITAN_COMPILE: replace(_TORCHTITAN, fused_elementwise=True),
    Framework.MEGATRON: _MEGATRON,
    Framework.NEMO: replace(_MEGATRON, tp_comm_overlap=True),
}
"""Each framework's runtime."""


def parse_framework(name: str) -> Framework:
    """The framework called `name` (ValueError naming the choices)."""
    try:
        return Framework(str(name).strip().lower())
    except ValueError:
        allowed = ", ".join(f.value for f in Framework)
        raise ValueError(
            f"runtime {name!r} is not a framework paraplan prices; use one of {allowed}"
        ) from None


def framework_of(runtime: Runtime) -> Framework | None:
    """The framework whose runtime `runtime` is; None for settings no framework has (an API
    caller's own `Runtime`)."""
    for framework, known in RUNTIMES.items():
        if known == runtime:
            return framework
    return None


def describe_runtime(runtime: Runtime) -> str:
    """The runtime's name for people: its framework's, or "custom"."""
    framework = framework_of(runtime)
    return "custom" if framework is None else framework.value


def is_own(runtime: Runtime) -> bool:
    """Whether `runtime` is paraplan's executor's (the plans `paraplan run` runs as priced)."""
    return runtime == RUNTIMES[Framework.PARAPLAN]
