"""The types every trainer mapping shares: the trainer, what a trainer configuration says
(`TrainerSetup`), and what a trainer cannot express (`Gap`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import StrEnum

from ..planner.config import EpDispatch, Precision, RecomputeModule, Runtime
from ..planner.cost.count_split import CountSplit
from ..planner.cost.recompute_pattern import RecomputePattern
from ..planner.frameworks import Framework
from ..planner.model import LatentAttention, LayerKind, ModelProfile
from ..planner.pins import Pins
from ..planner.plan import Plan
from ..planner.strategy import Recompute, Schedule, Strategy


class Target(StrEnum):
    """A trainer paraplan writes configurations for and reads them from."""

    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Gap:
    """A plan feature a trainer cannot express as planned."""

    feature: str
    """The feature in words, with the plan's value (e.g. ``ZeRO-1 (zero_stage=1)``)."""
    nearest: str
    """What the trainer gets instead ('' when it has nothing near: then export refuses)."""

    @property
    def refused(self) -> bool:
        """Whether the trainer has nothing near (the export stops, naming the feature)."""
        return not self.nearest


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeSays:
    """What a Megatron configuration sets of its runtime (`Runtime`'s fields of the same
    names): `--recompute-modules`, `--overlap-grad-reduce`, `--overlap-param-gather`,
    `--grad-reduce-in-bf16`, `--no-bias-swiglu-fusion`, `--fp8-param-gather`,
    `--no-overlap-p2p-communication`, `--moe-token-dispatcher-type`."""

    recompute_modules: tuple[RecomputeModule, ...]
    """What selective recompute redoes."""
    grad_reduce_overlap: bool
    """Gradient reductions overlap the backward."""
    param_gather_overlap: bool
    """ZeRO-1/2's parameter gathers overlap the next forward."""
    fp32_grads: bool = True
    """Gradients accumulated and reduced in fp32 (Megatron-LM's default under `--bf16`);
    False: `--grad-reduce-in-bf16`."""
    glu_keeps_input_only: bool = True
    """The fused SwiGLU (Megatron-LM's default); False: `--no-bias-swiglu-fusion`."""
    pp_comm_overlap: bool = True
    """Interleaved 1F1B's sends under compute (Megatron-LM's default); False:
    `--no-overlap-p2p-communication`."""
    fp8_all_gather: bool | None = None
    """Parameters gathered in fp8: `--fp8-param-gather` (Megatron-LM's default: bf16); None
    outside fp8 training, where it means nothing (the runtime's own kept)."""
    ep_dispatch: EpDispatch | None = None
    """How the experts' tokens travel: `--moe-token-dispatcher-type flex` (DeepEP or HybridEP,
    once per node), else one all-to-all; None without expert parallelism (the runtime's own)."""

    def apply(self, runtime: Runtime) -> Runtime:
        """`runtime` with these settings (its fields of the same names)."""
        said = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(runtime, **{k: v for k, v in said.items() if v is not None})


_NOUNS = {
    "blocks": "blocks",
    "hidden": "hidden size",
    "heads": "attention heads",
    "kv_heads": "key/value heads",
    "experts": "experts",
    "top_k": "experts per token",
    "ffn": "MLP size",
}
"""`ModelSays`' fields in words (its messages)."""


@dataclass(frozen=True, slots=True)
class Stated:
    """One size as a configuration states it."""

    value: int
    """The size."""
    flag: str
    """How the configuration names it (e.g. ``--num-layers``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StatedWindows:
    """Each block's sliding window as a configuration states it (`LayerCost.attn_window`)."""

    value: tuple[int, ...]
    """Keys each query sees, per block in order (0: the whole sequence)."""
    flag: str
    """How the configuration states them (e.g. ``--window-size``)."""

    @staticmethod
    def describe(windows: tuple[int, ...]) -> str:
        """The windows in words: none, or their sizes and how many blocks have them."""
        sizes = sorted({w for w in windows if w})
        if not sizes:
            return "no sliding window"
        shown = " or ".join(str(w) for w in sizes)
        return f"sliding windows of {shown} keys on {sum(1 for w in windows if w)} blocks"


@dataclass(frozen=True, kw_only=True, slots=True)
class StatedLatent:
    """Multi-head latent attention as an argument file states it (None fields: not stated,
    not compared)."""

    on: bool
    """Whether `--multi-latent-attention` is given."""
    q_lora_rank: int | None = None
    """`--q-lora-rank` (0: not given under `--multi-latent-attention`: full rank)."""
    kv_lora_rank: int | None = None
    """`--kv-lora-rank`."""
    qk_head_dim: int | None = None
    """`--qk-head-dim` + `--qk-pos-emb-head-dim`: each query and key head's whole width."""
    qk_rope_head_dim: int | None = None
    """`--qk-pos-emb-head-dim`."""
    v_head_dim: int | None = None
    """`--v-head-dim`."""

    def mismatch(self, latent: LatentAttention | None, head_dim: int) -> str | None:
        """What differs from a model with `latent` attention and heads `head_dim` wide, in words
        (the flag, both values); None when everything stated agrees."""
        if latent is None:
            return "--multi-latent-attention, but the model has plain attention" * self.on or None
        if not self.on:
            return "no --multi-latent-attention, but the model has latent attention"
        ours = {
            "q-lora-rank": (self.q_lora_rank, latent.q_lora_rank),
            "kv-lora-rank": (self.kv_lora_rank, latent.kv_lora_rank),
            "qk-head-dim + --qk-pos-emb-head-dim": (self.qk_head_dim, head_dim),
            "qk-pos-emb-head-dim": (self.qk_rope_head_dim, latent.qk_rope_head_dim),
            "v-head-dim": (self.v_head_dim, latent.v_head_dim),
        }
        for flag, (said, have) in ours.items():
            if said is not None and said != have:
                return f"--{flag} gives {said}, but the model has {have}"
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class StatedArchitecture:
    """What an argument file states of a MoE model's layout and its latent attention."""

    dense_ffn: Stated | None = None
    """The dense blocks' MLP (`--ffn-hidden-size`, where `--moe-ffn-hidden-size` sets the
    experts' apart)."""
    shared_expert_ffn: Stated | None = None
    """The shared experts, all together (`--moe-shared-expert-intermediate-size`; 0 without)."""
    moe_blocks: tuple[bool, ...] | None = None
    """Whether each block has experts (`--moe-layer-freq`; every block without it)."""
    moe_blocks_flag: str = ""
    """How the file states `moe_blocks`."""
    latent: StatedLatent | None = None
    """The attention's latent projections (None where the file does not state the model)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSays:
    """The model's sizes as a trainer configuration states them (None: not stated), checked
    against the model planned (`mismatch`): a configuration judged on another model than its
    own would be priced for shapes it never runs."""

    blocks: Stated | None = None
    """Transformer blocks (Megatron's `--num-layers`)."""
    hidden: Stated | None = None
    """Hidden size (`--hidden-size`)."""
    heads: Stated | None = None
    """Attention heads (`--num-attention-heads`)."""
    kv_heads: Stated | None = None
    """Key/value heads (`--num-query-groups` under `--group-query-attention`)."""
    experts: Stated | None = None
    """Routed experts per MoE block (`--num-experts`)."""
    top_k: Stated | None = None
    """Experts each token is routed to (`--moe-router-topk`)."""
    ffn: Stated | None = None
    """The MLP's hidden size, each expert's in a MoE block (`--ffn-hidden-size`,
    `--moe-ffn-hidden-size`; without them, Megatron-LM's default)."""
    windows: StatedWindows | None = None
    """Each block's sliding window (`--window-size`, `--window-attn-skip-freq`)."""
    architecture: StatedArchitecture = field(default_factory=StatedArchitecture)
    """A MoE model's dense blocks and shared experts, and latent attention (Megatron's)."""
    routing: tuple[int, int] | None = None
    """Expert groups and the groups each token may route to (`--moe-router-num-groups`,
    `--moe-router-group-topk`; (1, 1): not group-limited); None: not a MoE configuration.
    A routing setting, not a size: the judged model takes it (`routed`)."""

    def routed(self, profile: ModelProfile) -> tuple[ModelProfile, str | None]:
        """`profile` with the configuration's group-limited routing where it states another
        than the model's, and a note saying so; `profile` and None otherwise."""
        if self.routing is None or not profile.experts:
            return profile, None
        groups, top_k = self.routing
        if (groups, top_k) == (profile.routing_groups, profile.routing_group_top_k):
            return profile, None
        if groups > 1 and profile.experts % groups:
            raise ValueError(
                f"--moe-router-num-groups {groups} does not divide {profile.name}'s "
                f"{profile.experts} experts (Megatron-Core requires it); fix the configuration"
            )
        said = f"{top_k} of {groups} groups" if groups > 1 else "no group limit"
        ours = (
            f"{profile.routing_group_top_k} of {profile.routing_groups}"
            if profile.routing_groups > 1
            else "none"
        )
        routed = replace(profile, routing_groups=groups, routing_group_top_k=top_k)
        return routed, f"experts routed as configured ({said}; the model's own: {ours})"

    def mismatch(self, profile: ModelProfile) -> str | None:
        """The first size that differs from `profile`'s, in words naming both values and the
        configuration's flag; None when all agree."""
        ours = {
            "blocks": profile.decoder_blocks,
            "hidden": profile.hidden,
            "heads": profile.heads,
            "kv_heads": profile.kv_heads,
            "ffn": profile.ffn,  # each expert's in a MoE block
            "experts": profile.experts,
            "top_k": profile.top_k if profile.experts else None,
        }
        for f in fields(self):
            if f.name in ("windows", "architecture", "routing"):
                continue
            said: Stated | None = getattr(self, f.name)
            have = ours[f.name]
            if said is not None and have is not None and said.value != have:
                fix = f" (or fix {said.flag})" if said.flag[:1] in "-[" else ""
                return (
                    f"{said.flag} gives {_NOUNS[f.name]} {said.value}, but {profile.name} has "
                    f"{have}: the configuration is for another model; plan its model with "
                    f"--model{fix}"
                )
        return self._windows_mismatch(profile) or self._architecture_mismatch(profile)

    def _architecture_mismatch(self, profile: ModelProfile) -> str | None:
        """Where the stated MoE layout or latent attention differs from `profile`'s, in words;
        None when they agree or are not stated."""
        said = self.architecture
        moe = profile.moe_blocks[: profile.decoder_blocks]
        problem = None
        if said.latent is not None:
            problem = said.latent.mismatch(profile.latent_attention, profile.head_size)
        stated_moe = said.moe_blocks or moe  # a count that differs is told by `blocks`
        differs = len(stated_moe) == len(moe) and stated_moe != moe
        if problem is None and profile.experts and differs:
            dense = [i for i, has in enumerate(stated_moe) if not has]
            ours = [i for i, has in enumerate(moe) if not has]
            problem = (
                f"{said.moe_blocks_flag} gives dense blocks {_blocks(dense)}, but "
                f"{profile.name} has {_blocks(ours)}"
            )
        sizes = (
            (said.dense_ffn, profile.dense_ffn or profile.ffn, profile.experts and not all(moe)),
            (said.shared_expert_ffn, profile.shared_expert_ffn, profile.experts > 0),
        )
        for stated, have, applies in sizes:
            if problem is None and stated is not None and applies and stated.value != have:
                problem = f"{stated.flag} gives {stated.value}, but {profile.name} has {have}"
        if problem is None:
            return None
        return f"{problem}: the configuration is for another model; plan its model with --model"

    def _windows_mismatch(self, profile: ModelProfile) -> str | None:
        """Where the stated windows differ from `profile`'s blocks' (`LayerCost.attn_window`),
        in words; None when they agree or are not stated."""
        said = self.windows
        have = tuple(x.attn_window for x in profile.layers if x.kind == LayerKind.BLOCK)
        if said is None or len(said.value) != len(have):
            return None  # a block count that differs is told by `blocks`
        # a window holding the whole sequence is no window at this length (as profiled)
        value = tuple(w if w < profile.seq_len else 0 for w in said.value)
        if value == have:
            return None
        return (
            f"{said.flag} gives {StatedWindows.describe(value)}, but {profile.name} has "
            f"{StatedWindows.describe(have)}: the configuration is for another model; plan "
            f"its model with --model" + (f" (or fix {said.flag})" if said.flag[:1] == "-" else "")
        )


def _blocks(indices: list[int]) -> str:
    """Block indices in words (a run as first-last)."""
    if not indices:
        return "none"
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(map(str, indices))


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerSetup:
    """What a trainer configuration says, in the planner's terms."""

    target: Target
    """The trainer the configuration is for."""
    strategy: Strategy
    """Degrees, sharding, schedule, micro-batch and recompute, as the search names them."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int | None
    """Tokens per sequence (None when the configuration does not say: DeepSpeed's)."""
    precision: Precision
    """Training precision (bf16/fp16 are mixed precision with fp32 master weights)."""
    notes: tuple[str, ...] = ()
    """What was read approximately or left out, in words (printed beside the comparison)."""
    runtime: Framework | None = None
    """The trainer's runtime as the configuration states it (`paraplan plan --runtime`'s
    preset: Megatron-LM's, NeMo's with `--tp-comm-overlap`, torchtitan's eager or compiled);
    None where paraplan has no preset for the trainer (DeepSpeed)."""
    runtime_says: RuntimeSays | None = None
    """What the configuration sets of the runtime beyond the preset (Megatron's recompute
    modules and data-parallel overlap flags); None: the preset as it is."""
    split: CountSplit | None = None
    """How the trainer splits the blocks over the pipeline chunks where the configuration
    fixes it by count (Megatron-Core's rules, a layout, torchtitan's module lists); None: as
    paraplan's plan would, by cost."""
    model_says: ModelSays | None = None
    """The model's sizes the configuration states (checked against the model planned)."""
    pattern: RecomputePattern | None = None
    """The blocks the configuration fully recomputes where it names them by a rule (then
    `strategy.recompute` is `per_layer`, priced with these blocks); None: its recompute is
    uniform."""

    mtp_layers: int = 0
    """Multi-token-prediction modules the configuration trains (Megatron's `--mtp-num-layers`);
    0: none."""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation included)."""
        return self.global_batch // (self.strategy.dp * self.strategy.micro_batch_size)

    def pins(self) -> Pins:
        """Every dimension pinned, as `--fix` would (the search picks only the mesh order)."""
        return Pins.of(self.strategy)


def plan_strategy(plan: Plan) -> Strategy:
    """The plan's strategy, HSDP shard group included."""
    s = plan.strategy()
    shard = plan.parallelism.dp_shard
    return s if shard == s.dp else replace(s, dp_shard=shard)


def uniform_recompute(plan: Plan) -> Recompute:
    """The one policy for every block nearest to a per-layer plan and at least as frugal with
    memory: full if any block is fully recomputed, else selective if any is, else none."""
    blocks = {d.recompute for d in plan.layers if d.name.startswith("block")}
    for policy in (Recompute.FULL, Recompute.SELECTIVE):
        if policy in blocks:
            return policy
    return Recompute.NONE


def check_batch(setup: TrainerSetup) -> TrainerSetup:
    """`setup` if its batch splits evenly over dp x micro-batch; else ValueError naming the
    numbers."""
    s = setup.strategy
    per_step = s.dp * s.micro_batch_size
    if setup.global_batch % per_step:
        raise ValueError(
            f"{setup.target} config: global batch {setup.global_batch} is not a multiple of "
            f"{per_step} sequences ({s.dp} data-parallel ranks x micro-batches of "
            f"{s.micro_batch_size} sequence{'' if s.micro_batch_size == 1 else 's'}); fix the "
            "batch sizes in the config"
        )
    if s.pp > 1 and s.schedule == Schedule.NONE:
        raise ValueError(f"{setup.target} config: pp={s.pp} needs a pipeline schedule")
    return setup


TARGET_NAMES = {
    Target.TORCHTITAN: "torchtitan",
    Target.MEGATRON: "Megatron-LM",
    Target.DEEPSPEED: "DeepSpeed",
}
"""Each trainer's name in messages."""
_WITHOUT = {
    "powersgd": "uncompressed gradient reduction ({target} has no PowerSGD hook)",
    "offload_params": "parameters and gradients kept on the GPU ({target} has no parameter "
    "offload)",
    "offload_activations": "activations kept on the GPU ({target} has no saved-tensor offload)",
    "async_pipeline": "a synchronous pipeline, flushed every step ({target} has no PipeDream-2BW)",
}
"""What a trainer runs instead of an option it does not have, by option."""


def option_gaps(
    s: Strategy,
    target: Target,
    *,
    has: frozenset[str] = frozenset(),
    why: dict[str, str] | None = None,
) -> tuple[Strategy, list[Gap]]:
    """PowerSGD, parameter and activation offload and the asynchronous pipeline (schema v5),
    each that `target` has no option for (those not in `has`) turned off with a `Gap` naming
    it and what the trainer runs instead (`why` overrides the wording per option), so that an
    export never drops one silently."""
    name = TARGET_NAMES[target]
    words = {k: v.format(target=name) for k, v in _WITHOUT.items()} | (why or {})
    gaps: list[Gap] = []
    if s.powersgd_rank is not None and "powersgd" not in has:
        gaps.append(
            Gap(
                feature=f"PowerSGD gradient compression (powersgd_rank={s.powersgd_rank})",
                nearest=words["powersgd"],
            )
        )
        s = replace(s, powersgd_rank=None)
    if s.offload_params and "offload_params" not in has:
        gaps.append(
            Gap(
                feature="parameter offload (offload_params=true)",
                nearest=words["offload_params"],
            )
        )
        s = replace(s, offload_params=False)
    if s.offload_activations and "offload_activations" not in has:
        gaps.append(
            Gap(
                feature="activation offload (offload_activations=true)",
                nearest=words["offload_activations"],
            )
        )
        s = replace(s, offload_activations=False)
    if s.async_pipeline and "async_pipeline" not in has:
        gaps.append(
            Gap(
                feature="asynchronous pipeline (async_pipeline=true)",
                nearest=words["async_pipeline"],
            )
        )
        s = replace(s, async_pipeline=False)
    return s, gaps
