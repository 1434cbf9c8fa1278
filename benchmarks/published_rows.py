"""The published training runs (benchmarks/published_runs.yaml) read into cases: each usable
row's model, cluster, runtime and published degrees as pins, its published step time, and why
the others are left out (`load_cases`; `validate_published.py` prices them)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from paraplan.planner.cluster import Cluster, parse_cluster
from paraplan.planner.config import EpDispatch, Precision, RecomputeModule, Runtime, TrainConfig
from paraplan.planner.cost.count_split import CountSplit
from paraplan.planner.cost.layout import StageSplit
from paraplan.planner.frameworks import RUNTIMES, Framework, torchtitan_framework
from paraplan.planner.model_spec import PRESETS, Attention, TransformerSpec
from paraplan.planner.pins import Pins
from paraplan.planner.strategy import Recompute, Schedule

DATA = Path(__file__).with_name("published_runs.yaml")
HELD_OUT_MODULUS = 3
"""A row is held out when sha256(id) mod 3 == 0 (about a third, fixed by the names alone)."""

_FLASH_SOURCES = ("torchtitan", "llama3", "megatron_readme", "nemo")
"""Rows from runs with fused (flash) attention; older Megatron-LM runs (2019-2022), BLOOM and
OPT computed attention unfused."""
_OTHER_SYSTEMS = {
    "megascale24_megascale": (
        "MegaScale's own system (overlapped TP/PP/DP communication, fused kernels, LAMB): "
        "its Megatron-LM baseline rows are priced instead"
    ),
    "narayanan21_zero3": (
        "DeepSpeed ZeRO-3 as of 2021: per-parameter gathers ran an order of magnitude below "
        "the network's bound (docs/validation.md); the planner prices FSDP2's per-block units"
    ),
}
"""Rows measuring an implementation the planner does not price, with the reason."""
LONG_CONTEXT = 65536
"""Tokens above which a row is a long-context row: priced since 2026-11-27 (they were left out
with the throughputs in FLOP/s that need the source's attention convention), a regime no
constant was fitted on."""

_EVEN_SPLIT_SOURCES = ("narayanan21", "korthikanti22", "bloom", "megascale", "megatron_readme")
"""Megatron-LM splits layers evenly over pipeline stages: priced with that split."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One published run, as the cost model sees it."""

    id: str
    """Row id in published_runs.yaml."""
    spec: TransformerSpec
    """The model."""
    cluster: str
    """Cluster text for `parse_cluster`."""
    train: TrainConfig
    """Batch, sequence, precision."""
    pins: Pins
    """The published configuration."""
    split: StageSplit | CountSplit
    """How the published run split layers over stages."""
    published_step_s: float
    """Published step time (given, or derived from the published throughput)."""
    pair: str | None
    """Id of the row it is compared with."""
    held_out: bool
    """Whether the row is in the held-out third."""
    family: str
    """Strategy family, for the table."""


def held_out(row_id: str) -> bool:
    """Whether a row is in the held-out third (by its name alone)."""
    return int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


def _spec(row: dict[str, Any]) -> TransformerSpec | None:
    m = row["model"]
    needed = ("layers", "hidden", "heads", "seq_len", "vocab")
    if any(m.get(k) is None for k in needed):
        return None
    flash = row["id"].startswith(_FLASH_SOURCES)
    name = str(m["name"]).lower()
    llama = "llama" in name or "qwen" in name  # Qwen: Llama's block, SwiGLU, RMSNorm, RoPE
    gpt_oss = "gpt-oss" in name  # banded attention on every other block, biased projections
    if m.get("experts") and not ("qwen3" in name or gpt_oss):
        return None
    base = PRESETS["gpt-oss-120b" if gpt_oss else "llama3-8b" if llama else "gpt3-175b"]
    experts = m.get("experts") or 0
    return dataclasses.replace(
        base,
        name=row["id"],
        layers=m["layers"],
        hidden=m["hidden"],
        heads=m["heads"],
        kv_heads=m.get("kv_heads") or m["heads"],
        ffn=m.get("ffn") or (base.ffn if llama else 4 * m["hidden"]),
        vocab=m["vocab"],
        seq=m["seq_len"],
        attention=Attention.FLASH if flash or llama or gpt_oss else Attention.MATH,
        head_dim=m.get("head_dim") or 0,
        experts=experts,
        top_k=m.get("top_k") or 0,
        expert_ffn=m["ffn"] if experts else 0,
        sliding_window=m.get("sliding_window") or 0,
        full_attention_every=m.get("full_attention_every") or 0,
    )


def _published_step_s(row: dict[str, Any], spec: TransformerSpec) -> float | None:
    """Seconds per step: given, or from tokens/s per GPU, or from TFLOP/s per GPU with the
    source's FLOP count (Narayanan et al. 2021 Eq. 3, with recompute: hardware FLOPs)."""
    measured, cfg, n = row["measured"], row["config"], row["cluster"]["num_gpus"]
    if measured.get("step_time_s"):
        return float(measured["step_time_s"])
    tokens = cfg["global_batch"] * spec.seq
    if measured.get("tokens_per_s_per_gpu"):
        return tokens / (measured["tokens_per_s_per_gpu"] * n)
    basis = str(row.get("flops_basis") or "")
    rate = measured.get("tflops_per_gpu")
    if rate and basis.startswith("hardware"):
        b, s, layers, h, v = cfg["global_batch"], spec.seq, spec.layers, spec.hidden, spec.vocab
        flops = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
        return flops / (rate * 1e12 * n)
    if rate and basis.startswith("model"):
        # model FLOPs (6N plus the full attention matrix, as Megatron-LM's MFU counts them)
        profile = spec.to_profile(seq_len=spec.seq)
        flops = sum(x.fwd_flops + x.bwd_flops for x in profile.layers) * cfg["global_batch"]
        return flops / (rate * 1e12 * n)
    return None


def _family(cfg: dict[str, Any]) -> str:
    if (cfg.get("cp") or 1) > 1:
        return "CP"
    if cfg.get("zero_stage") == 3:
        return "FSDP/ZeRO-3" + ("+TP" if (cfg.get("tp") or 1) > 1 else "")
    if (cfg.get("pp") or 1) > 1:
        return "TP+PP"
    if cfg.get("zero_stage") in (1, 2):
        return "ZeRO-1/2+TP"
    return "TP/DP"


def runtime_of(row: dict[str, Any]) -> Runtime:
    """How the row's framework ran its kernels, from its source and notes:
    - Megatron-LM's README runs (Megatron-Core r0.8 on H100) state fine-grained TP
      communication overlap (--tp-comm-overlap) and run Transformer Engine's fused attention;
      so do NeMo's Megatron-Bridge performance recipes (Megatron-Core with Transformer Engine;
      where the notes quote a recipe with `tp_comm_overlap=False`, without TP overlap, and with
      `overlap_moe_expert_parallel_comm=True`, the experts' all-to-alls overlapped; the
      experts' tokens dispatched as the recipe says, `moe_token_dispatcher_type 'alltoall'`
      as one all-to-all, the flex dispatcher (`moe_flex_dispatcher_backend` deepep or
      hybridep) once per node, NeMo's default where the notes quote neither;
      NeMo 2.0's Llama 3 70B recipe adds `MegatronCommOverlapCallback(tp_comm_overlap=True)`
      with the userbuffers of h8192, tp4, mbs1, seq 8192, the row's own shape; a recipe's
      `recompute_modules`, in the row's config, is what its selective recompute redoes; NeMo's
      recipes reduce gradients in bf16, `grad_reduce_in_fp32=False`, and gather fp8 parameters,
      `fp8_param_gather=True`, where Megatron-LM's own runs accumulate gradients in fp32, its
      default under `--bf16`, and gather bf16); under fp8
      they run Transformer Engine's Linear (`Float8Casts.TRANSFORMER_ENGINE`: fp8 weights cast
      once per step, inputs cast once and saved in fp8; NeMo's H100 recipes are "fp8cs",
      current scaling);
    - torchtitan rows without torch.compile (`--training.compile`, or Async TP, which is a
      compile pass) run eager PyTorch (one kernel per operator) and torch SDPA; Async TP
      overlaps the TP collectives; "FSDP float8 all-gather" gathers fp8 weights; its selective
      checkpointing is per operator (every other matmul);
    - every other row (Megatron-LM papers and its baselines, Megatron-DeepSpeed, Meta's Llama 3
      stack) runs fused elementwise kernels, no TP overlap, and FlashAttention-2-class
      attention (or unfused attention, which the profile itself says);
    - Megatron-LM-based rows keep sequence shards for backward and gather them again (torch's
      SequenceParallel, torchtitan's, keeps the gathered inputs), and run Megatron's fused
      vocabulary-parallel cross-entropy (torchtitan runs torch's)."""
    text = f"{row.get('notes', '')} {row.get('quote', '')}"
    rid = row["id"]
    if rid.startswith(("megatron_readme", "nemo")):
        # `paraplan plan --runtime nemo`, unless the recipe quoted in the notes turns TP
        # overlap off (then `megatron`'s) or overlaps the experts' all-to-alls
        tp_off = "tp_comm_overlap=False" in text
        runtime = RUNTIMES[Framework.MEGATRON if tp_off else Framework.NEMO]
        ep_overlap = "overlap_moe_expert_parallel_comm=True" in text
        runtime = dataclasses.replace(runtime, ep_comm_overlap=ep_overlap)
        if "moe_token_dispatcher_type 'alltoall'" in text:  # the recipe's own dispatcher
            runtime = dataclasses.replace(runtime, ep_dispatch=EpDispatch.ALL_TO_ALL)
        elif "moe_flex_dispatcher_backend" in text:  # flex: DeepEP or HybridEP
            runtime = dataclasses.replace(runtime, ep_dispatch=EpDispatch.HIERARCHICAL)
        if rid.startswith("megatron_readme"):  # Megatron-LM's own runs: its defaults (fp32
            runtime = dataclasses.replace(runtime, fp32_grads=True, fp8_all_gather=False)
        modules = row["config"].get("recompute_modules")  # the recipe's `recompute_modules`
        if modules:
            runtime = dataclasses.replace(
                runtime, recompute_modules=tuple(RecomputeModule(m) for m in modules)
            )
        return runtime
    if rid.startswith("torchtitan"):
        # torchtitan's "selective" is per-operator SAC (`selective_ac_option = "op"`, as its
        # shipped Llama 3 configs set it, train_configs/llama3_8b.toml of Oct 2024; the job
        # config's own default, "2", is every 2nd block: every row here states or implies
        # "op"). Async TP is a
        # torch.compile pass (torchtitan refuses `enable_async_tensor_parallel` without
        # compile), so a run quoted with it is compiled and overlaps its TP collectives.
        async_tp = "asynctp" in str(row.get("quote", "")).lower().replace(" ", "")
        compiled = "--training.compile" in text or async_tp
        eager = not compiled and ("no torch.compile" in text or "torch.compile" not in text)
        # --runtime torchtitan(-compile, -async-tp), and the row's fp8 gathers
        framework = torchtitan_framework(compiled=not eager, async_tp=async_tp)
        return dataclasses.replace(
            RUNTIMES[framework], fp8_all_gather="fsdp float8 all-gather" in text.lower()
        )
    return Runtime(fused_elementwise=True, sp_saves_gathered_input=False, torch_loss=False)


_FP8_NAMES = ("fp8", "fp8_cs", "fp8_ds", "fp8_mx", "mxfp8")
"""Precision names the sources use for fp8 training: per-tensor current or delayed scaling and
MXFP8's block scaling (Blackwell), all priced at the fp8 tensor-core rate."""
_UNPRICED_PRECISIONS = ("nvfp4", "fp4")
"""Precisions paraplan does not price (no fp4 rate in the catalog): such rows are left out."""
_PRICED_GPUS = ("a100-80gb", "a100-40gb", "h100", "h100-hbm2e", "h200", "v100", "b200", "gb200")
"""Catalog accelerators the rows are priced on."""


def case_cluster(case: Case) -> Cluster:
    """The case's cluster (`N x accelerator`, then `:G` GPUs per node where not 8)."""
    name, _, per_node = case.cluster.partition(":")
    return parse_cluster(name, gpus_per_node=int(per_node) if per_node else None)


def _split_of(row: dict[str, Any]) -> StageSplit | CountSplit:
    """How the run split its blocks over pipeline chunks: the row's `pipeline_split` where the
    source's recipe says (`even`, `balanced`, or Megatron-Core's flags as `CountSplit`
    fields), else Megatron-LM's even split for its papers' rows and a balanced one otherwise."""
    given = row["config"].get("pipeline_split")
    if isinstance(given, dict):
        return CountSplit(**given)
    if given is not None:
        return StageSplit(given)
    return StageSplit.EVEN if row["id"].startswith(_EVEN_SPLIT_SOURCES) else StageSplit.BALANCED


def load_cases(path: Path = DATA) -> tuple[list[Case], list[tuple[str, str]]]:
    """The usable rows, and the rows left out with why."""
    rows = yaml.safe_load(path.read_text())["runs"]
    cases, skipped = [], []
    for row in rows:
        cfg, gpu = row["config"], row["cluster"]["gpu"]
        spec = _spec(row)
        why = ""
        if spec is None:
            why = "model not fully specified"
        elif any(cfg.get(k) is None for k in ("tp", "pp", "dp")):
            why = "degrees not stated"
        elif str(cfg.get("precision") or "").lower() in _UNPRICED_PRECISIONS:
            why = f"precision {cfg['precision']} (no fp4 rate in the catalog)"
        elif gpu not in _PRICED_GPUS:
            why = f"accelerator {gpu}"
        elif row["id"].startswith(tuple(_OTHER_SYSTEMS)):
            why = _OTHER_SYSTEMS[row["id"].split("_")[0] + "_" + row["id"].split("_")[1]]
        elif (row["model"].get("seq_len") or 0) > LONG_CONTEXT and not (
            row["measured"].get("step_time_s") or row["measured"].get("tokens_per_s_per_gpu")
        ):  # a throughput in FLOP/s at long context needs the source's attention convention
            why = "sequence over 64K: the source's attention FLOP convention is not stated"
        step = None if spec is None else _published_step_s(row, spec)
        if not why and step is None:
            why = "no step time or throughput we can convert"
        if why:
            skipped.append((row["id"], why))
            continue
        assert spec is not None and step is not None
        named = str(cfg.get("precision") or "").lower().replace("-", "_")
        precision = Precision.FP16 if named == "fp16" or gpu == "v100" else None
        if named in _FP8_NAMES:  # tensor-wise and block-scaled fp8 run the fp8 tensor cores
            precision = Precision.FP8
        train = TrainConfig(
            global_batch=cfg["global_batch"],
            seq_len=spec.seq,
            precision=precision or Precision.BF16,
            runtime=runtime_of(row),
        )
        v = cfg.get("virtual_stages")
        pp = cfg["pp"]
        schedule = None
        if pp == 1:
            schedule = Schedule.NONE
        elif v is not None:
            schedule = Schedule.INTERLEAVED_1F1B if v > 1 else Schedule.ONE_F_ONE_B
        rc = cfg.get("recompute")
        pins = Pins(
            dp=cfg["dp"],
            tp=cfg["tp"],
            pp=pp,
            cp=cfg.get("cp") or 1,
            ep=cfg.get("ep") or 1,
            zero_stage=cfg.get("zero_stage"),
            micro_batch_size=cfg.get("micro_batch_size"),
            virtual_stages=v,
            schedule=schedule,
            recompute=Recompute(rc) if rc else None,
            sequence_parallel=cfg.get("sequence_parallel") if cfg["tp"] > 1 else False,
            offload_optimizer=False,  # no published run here offloads
        )
        gpn = row["cluster"].get("gpus_per_node") or 8
        cases.append(
            Case(
                id=row["id"],
                spec=spec,
                cluster=f"{row['cluster']['num_gpus']}x{gpu}" + (f":{gpn}" if gpn != 8 else ""),
                train=train,
                pins=pins,
                split=_split_of(row),
                published_step_s=step,
                pair=row.get("pair"),
                held_out=held_out(row["id"]),
                family=_family(cfg),
            )
        )
    return cases, skipped
