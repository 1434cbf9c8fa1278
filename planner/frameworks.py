"""The training frameworks a plan can be priced for (`paraplan plan --runtime`): each is a
`Runtime`, how that framework runs a step's kernels, as its sources and defaults say.

A plan is priced for one of them; paraplan's executor runs only its own (`PARAPLAN`), so a plan
priced for another is meant for `paraplan export` to that trainer, and `paraplan run` refuses
it (its measured-against-predicted comparison would read another framework's prices).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from .config import (
    AttentionKernel,
    EpDispatch,
    Float8Casts,
    RecomputeModule,
    Runtime,
    SelectiveRecompute,
)
from .strategy import Schedule


class Framework(StrEnum):
    """A training framework paraplan prices (its runtime: `RUNTIMES`; what it runs: `SPACES`)."""

    PARAPLAN = "paraplan"
    """paraplan's executor: eager PyTorch, torch SDPA, torch's sequence parallelism (keeps the
    gathered inputs), torch's cross-entropy, FSDP2 with the embedding and head in one root
    unit."""
    TORCHTITAN = "torchtitan"
    """torchtitan as configured by default (`compile.enable` off): eager PyTorch, torch SDPA,
    per-operator selective checkpointing (`selective_ac_option = "op"`), FSDP2 units for the
    embedding, each block and norm + output apart, torchao's Float8Linear under fp8."""
    TORCHTITAN_COMPILE = "torchtitan-compile"
    """torchtitan with `compile.enable` (`--training.compile` in its early releases): the
    elementwise operators fused by torch.compile (and torchao's fp8 casts with them);
    otherwise as `TORCHTITAN`."""
    TORCHTITAN_ASYNC_TP = "torchtitan-async-tp"
    """torchtitan compiled with Async TP (`compile.enable_async_tensor_parallel`;
    `parallelism.enable_async_tensor_parallel` before 0.3): torch.compile's micro-pipelining
    of the TP collectives with the GEMMs they feed, over symmetric memory within a node;
    otherwise as `TORCHTITAN_COMPILE`."""
    MEGATRON = "megatron"
    """Megatron-LM (Megatron-Core with Transformer Engine): fused elementwise kernels and
    attention, the sequence shards kept for backward and gathered again, its fused
    vocabulary-parallel cross-entropy, Transformer Engine's fp8 Linear; TP communication on the
    critical path (`--tp-comm-overlap` is off by default)."""
    NEMO = "nemo"
    """NeMo's Megatron-Bridge performance recipes: `MEGATRON` with TP communication overlapped
    with the GEMMs (userbuffers, `tp_comm_overlap`) and, for MoE models, the experts'
    all-to-alls overlapped with another micro-batch's compute (`ep_comm_overlap`: the
    recipes' `overlap_moe_expert_parallel_comm`, on for Qwen3 and DeepSeek-V3) and dispatched
    once per node (`ep_dispatch` hierarchical: the flex dispatcher with DeepEP or HybridEP, what
    most of Megatron-Bridge's MoE performance recipes set, and NeMo 2.0's on H100), gradients
    reduced in bf16 (`fp32_grads` off: the performance recipes' `grad_reduce_in_fp32 = False`)
    and, under fp8, parameters gathered in fp8 (`fp8_all_gather`: the fp8 presets'
    `fp8_param_gather = True`)."""


_MEGATRON = Runtime(
    fused_elementwise=True,
    attention=AttentionKernel.FUSED,
    sp_saves_gathered_input=False,
    norm_keeps_input_only=True,
    glu_keeps_input_only=True,
    pp_comm_overlap=True,
    torch_loss=False,
    fp8_casts=Float8Casts.TRANSFORMER_ENGINE,
)
_TORCHTITAN = Runtime(selective=SelectiveRecompute.EVERY_OTHER_MATMUL, fsdp_shared_root=False)
_TORCHTITAN_COMPILED = replace(
    _TORCHTITAN, fused_elementwise=True, norm_keeps_input_only=True, glu_keeps_input_only=True
)
"""torchtitan's runtime under torch.compile: fused elementwise kernels, and Inductor's
partitioner keeps an RMSNorm's input and rsqrt (not its normalized copy) and a SwiGLU's gate
and up (not silu(gate)): measured on Hugging Face's modules compiled on CPU, the same saved
bytes as Megatron-Core's fused kernels (tests/test_fused_saves.py)."""

RUNTIMES: dict[Framework, Runtime] = {
    Framework.PARAPLAN: Runtime(),
    Framework.TORCHTITAN: _TORCHTITAN,
    Framework.TORCHTITAN_COMPILE: _TORCHTITAN_COMPILED,
    Framework.TORCHTITAN_ASYNC_TP: replace(_TORCHTITAN_COMPILED, tp_comm_overlap=True),
    Framework.MEGATRON: _MEGATRON,
    Framework.NEMO: replace(
        _MEGATRON,
        tp_comm_overlap=True,
        ep_comm_overlap=True,
        ep_dispatch=EpDispatch.HIERARCHICAL,
        fp32_grads=False,
        fp8_all_gather=True,
    ),
}
"""Each framework's runtime."""


def torchtitan_framework(*, compiled: bool, async_tp: bool) -> Framework:
    """torchtitan's preset: eager, compiled, or compiled with Async TP (a torch.compile pass:
    torchtitan refuses it without compile, so it counts only where compiled)."""
    if not compiled:
        return Framework.TORCHTITAN
    return Framework.TORCHTITAN_ASYNC_TP if async_tp else Framework.TORCHTITAN_COMPILE


def parse_framework(name: str) -> Framework:
    """The framework called `name` (ValueError naming the choices)."""
    try:
        return Framework(str(name).strip().lower())
    except ValueError:
        allowed = ", ".join(f.value for f in Framework)
        raise ValueError(
            f"runtime {name!r} is not a framework paraplan prices; use one of {allowed}"
        ) from None


MODULE_RECOMPUTE = (Framework.MEGATRON, Framework.NEMO)
"""Frameworks whose selective recompute takes a list of modules (Megatron-Core's
`--recompute-modules`, `Runtime.recompute_modules`) and whose data-parallel overlap is a
flag (`--overlap-grad-reduce`, `--overlap-param-gather`): their runtime with any list or
flags is theirs."""
CONFIGURED_FIELDS = (
    "recompute_modules",
    "grad_reduce_overlap",
    "param_gather_overlap",
    "fp32_grads",
    "glu_keeps_input_only",
    "fp8_all_gather",
    "pp_comm_overlap",
    "ep_dispatch",
)
"""`Runtime` fields a Megatron configuration sets itself (`MODULE_RECOMPUTE`)."""


MTP_BY_DEFAULT = (Framework.NEMO,)
"""Frameworks whose recipes train the model's own multi-token-prediction modules
(Megatron-Bridge's DeepSeek-V3 recipe sets `mtp_num_layers = 1`, its config's
`num_nextn_predict_layers`); Megatron-LM (`--mtp-num-layers`, default none) and torchtitan
(`model_registry(num_mtp_layers=)`, default 0) train them when asked; paraplan's executor has
none (`mtp_layers`)."""


def mtp_layers(asked: int | None, declared: int, framework: Framework, any_engine: bool) -> int:
    """Multi-token-prediction modules a plan trains (`TrainConfig.mtp_layers`): `asked`
    (`--mtp-layers`), else the model's `declared` ones where `framework` trains them by default
    (`MTP_BY_DEFAULT`), else none. ValueError for a count below 0 or modules asked of paraplan's
    executor, which cannot run them (unless `any_engine`: priced for any trainer)."""
    if asked is None:
        return declared if framework in MTP_BY_DEFAULT else 0
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
        raise ValueError(f"--mtp-layers {asked!r}: give a whole number >= 0 (0: none)")
    if asked and framework == Framework.PARAPLAN and not any_engine:
        raise ValueError(
            f"--mtp-layers {asked}: paraplan's executor trains no multi-token-prediction "
            "modules; plan for the trainer that will (--runtime megatron, nemo or torchtitan) "
            "or leave --mtp-layers out"
        )
    return asked


AUTO_MODULES = "auto"
"""`--recompute-modules auto`: the search tries each of `MODULE_CHOICES` and keeps the faster."""
MODULE_CHOICES: tuple[tuple[RecomputeModule, ...], ...] = (
    (RecomputeModule.CORE_ATTN,),
    (RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT),
)
"""What `auto` weighs: Megatron-Core's default (the attention core) and what NeMo's MoE recipes
set (the norms and the experts' activation: memory-bound to redo, where a fused attention
core keeps little)."""
MOE_MODULE_CHOICES: tuple[tuple[RecomputeModule, ...], ...] = (
    *MODULE_CHOICES,
    (RecomputeModule.LAYERNORM, RecomputeModule.MOE),
)
"""What `auto` weighs for a MoE model: also the whole MoE layer beside the norms (Megatron-Core's
`moe`: it frees the experts' inputs and intermediates and the dispatched tokens, and redoes the
router, the dispatch and combine all-to-alls and the experts' GEMMs), for a plan that memory
binds; a dense model has no MoE layer, so it is not searched there."""


def parse_recompute_modules(text: str, framework: Framework) -> tuple[RecomputeModule, ...]:
    """`--recompute-modules a,b` for `framework`'s runtime (ValueError naming the rule and the
    choices: Megatron's and NeMo's runtime only, modules paraplan prices, none twice)."""
    names = [n.strip().lower() for n in str(text).split(",") if n.strip()]
    allowed = ", ".join(RecomputeModule)
    _check_takes_modules(text, framework)
    bad = [n for n in names if n not in set(RecomputeModule)]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(
            f"--recompute-modules {text!r}: give distinct modules from {allowed}, "
            f"comma-separated (e.g. layernorm,moe_act), or {AUTO_MODULES} (plan only)"
        )
    return tuple(RecomputeModule(n) for n in names)


def _check_takes_modules(text: str, framework: Framework) -> None:
    """ValueError unless `framework`'s runtime takes `--recompute-modules` (`MODULE_RECOMPUTE`)."""
    if framework not in MODULE_RECOMPUTE:
        raise ValueError(
            f"--recompute-modules {text}: only Megatron-Core's runtimes recompute modules by name "
            f"(--runtime {' or '.join(MODULE_RECOMPUTE)}); leave it out for {framework}"
        )


def module_choices(
    text: str | None, framework: Framework, *, allow_auto: bool, moe: bool = False
) -> tuple[tuple[RecomputeModule, ...], ...]:
    """The module lists a search prices for `--recompute-modules text` on `framework`'s
    runtime: the runtime's own where not given, every one of `MODULE_CHOICES` for `auto` (where
    `allow_auto`: `plan` only; `MOE_MODULE_CHOICES` for a `moe` model), else the one named
    (ValueError: `parse_recompute_modules`)."""
    if text is None:
        return (RUNTIMES[framework].recompute_modules,)
    if text.strip().lower() != AUTO_MODULES:
        return (parse_recompute_modules(text, framework),)
    _check_takes_modules(text, framework)
    if not allow_auto:
        raise ValueError(
            "--recompute-modules auto: only `paraplan plan` searches the module lists; "
            "name the modules (e.g. layernorm,moe_act)"
        )
    return MOE_MODULE_CHOICES if moe else MODULE_CHOICES


def framework_of(runtime: Runtime) -> Framework | None:
    """The framework whose runtime `runtime` is (Megatron-Core's whatever its configured
    fields, `CONFIGURED_FIELDS`); None for settings no framework has (an API caller's own
    `Runtime`)."""
    default = {f: getattr(Runtime(), f) for f in CONFIGURED_FIELDS}
    plain = replace(runtime, **default)
    dispatch = Runtime().ep_dispatch  # a trainer's setting (torchtitan's comm backend too),
    # which paraplan's executor has not: its all-to-all alone
    for framework, known in RUNTIMES.items():
        ours = framework == Framework.PARAPLAN
        if (
            known == runtime
            or (
                not ours
                and replace(known, ep_dispatch=dispatch) == replace(runtime, ep_dispatch=dispatch)
            )
            or (framework in MODULE_RECOMPUTE and replace(known, **default) == plain)
        ):
            return framework
    return None


def describe_runtime(runtime: Runtime) -> str:
    """The runtime's name for people: its framework's, or "custom"."""
    framework = framework_of(runtime)
    return "custom" if framework is None else framework.value


def is_own(runtime: Runtime) -> bool:
    """Whether `runtime` is paraplan's executor's (the plans `paraplan run` runs as priced)."""
    return runtime == RUNTIMES[Framework.PARAPLAN]


def runtime_note(runtime: Runtime) -> str:
    """What a table's header adds for a plan priced for another runtime than the executor's
    (", priced for megatron's runtime"); empty for the executor's."""
    return "" if is_own(runtime) else f", priced for {describe_runtime(runtime)}'s runtime"


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkSpace:
    """What a framework can run, to which a search for it is restricted (`Search`'s `space`),
    as its exporter writes it (paraplan/export: a strategy inside the space exports without
    an approximation)."""

    name: str
    """The framework, for messages."""
    schedules: frozenset[Schedule]
    """Pipeline schedules it runs (no pipeline is always run)."""
    zero_stages: frozenset[int]
    """Data-parallel sharding stages it runs."""
    per_layer_recompute: bool = False
    """Whether each block may get its own recompute policy."""
    hsdp: bool = False
    """Whether ZeRO-3 may shard within groups smaller than dp (HSDP)."""
    offload_optimizer_alone: bool = False
    """Whether it offloads the optimizer step without the parameters (else only FSDP2's
    CPUOffloadPolicy: ZeRO-3 with parameters, gradients and optimizer on the host)."""
    offload_params: bool = False
    """Whether it offloads parameter shards (`offload_params`)."""
    fold_experts: bool = False
    """Whether it runs experts whole beside TP, their group folded over the TP ranks
    (`Strategy.expert_tp` 1)."""
    split_experts: bool = True
    """Whether it splits experts over TP as the dense layers (`Strategy.expert_tp` None)."""
    ep_in_shard: bool = False
    """Whether expert parallelism must lie within the FSDP shard group (ZeRO 2 or 3, and
    `Strategy.ep_dp` dividing the shard group x cp): torchtitan's EP borrows the dp_shard, cp
    and tp ranks, never the replicated ones."""


_ALL_PIPELINES = frozenset(
    {
        Schedule.GPIPE,
        Schedule.ONE_F_ONE_B,
        Schedule.INTERLEAVED_1F1B,
        Schedule.INTERLEAVED_ZB,
        Schedule.ZBV,
        Schedule.DUALPIPEV,
    }
)
_TORCHTITAN_SPACE = FrameworkSpace(
    # torch.distributed.pipelining's schedules; FSDP2 (ZeRO-2 with reshard_after_forward
    # "never", ZeRO-3) or DDP, HSDP; `training.enable_cpu_offload` is CPUOffloadPolicy
    name="torchtitan",
    schedules=_ALL_PIPELINES,
    zero_stages=frozenset({0, 2, 3}),
    hsdp=True,
    offload_params=True,
    # torchtitan 0.3's EP borrows the dp_shard, cp and tp ranks (`ParallelDims`: efsdp =
    # dp_shard * cp * tp / ep): experts whole beside TP, never split over it
    fold_experts=True,
    split_experts=False,
    ep_in_shard=True,
)
_MEGATRON_SPACE = FrameworkSpace(
    # Megatron-Core's pipeline: 1F1B and interleaved 1F1B (uneven stages through
    # `--pipeline-model-parallel-layout`); the distributed optimizer (ZeRO-1), Megatron-FSDP
    # (ZeRO-2/3), `--optimizer-cpu-offload`
    name="megatron",
    schedules=frozenset({Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B}),
    zero_stages=frozenset({0, 1, 2, 3}),
    offload_optimizer_alone=True,
    fold_experts=True,  # `--expert-tensor-parallel-size 1` (MoE parallel folding)
)
SPACES: dict[Framework, FrameworkSpace] = {
    Framework.TORCHTITAN: _TORCHTITAN_SPACE,
    Framework.TORCHTITAN_COMPILE: _TORCHTITAN_SPACE,
    Framework.TORCHTITAN_ASYNC_TP: _TORCHTITAN_SPACE,
    Framework.MEGATRON: _MEGATRON_SPACE,
    Framework.NEMO: replace(_MEGATRON_SPACE, name="nemo"),
}
"""What each framework but paraplan's own runs (the executor's limits are
`capabilities.py`'s)."""


def space_of(runtime: Runtime) -> FrameworkSpace | None:
    """The space a search for `runtime`'s framework is restricted to; None: unrestricted (the
    executor's own runtime, whose limits the search applies by capability, or an API
    caller's own `Runtime`)."""
    framework = framework_of(runtime)
    return None if framework is None else SPACES.get(framework)
