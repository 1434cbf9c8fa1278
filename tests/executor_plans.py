"""Tiny models and plans built without the planner's search, for the executor tests (imported
by the tests and by the torchrun worker in `executor_helpers.py`)."""

from __future__ import annotations

from pathlib import Path

import torch

from paraplan.planner.config import Optimizer, Precision
from paraplan.planner.cost.estimate import Replay, TimeBreakdown
from paraplan.planner.cost.memory import MemoryBreakdown
from paraplan.planner.plan import (
    SCHEMA_VERSION,
    ChunkRange,
    ClusterInfo,
    LayerDecision,
    Mesh,
    ModelInfo,
    Parallelism,
    Plan,
    Predicted,
    StagePlan,
    TrainInfo,
)
from paraplan.planner.plan_io import save_plan
from paraplan.planner.strategy import MeshAxis, Recompute, Schedule

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB, POSITIONS, FFN = 4, 64, 4, 2, 512, 128, 176
EXPERTS, TOP_K, EXPERT_FFN = 4, 2, 32
"""The tiny Mixtral's experts per block, experts per token and expert width."""
SEQ_LEN = 32
"""Tokens per test sequence."""


def tiny_model(family: str = "gpt2", seed: int = 0) -> torch.nn.Module:
    """A 4-block Hugging Face causal LM (hidden 64, vocab 512), dropout off, seeded: GPT-2,
    Llama or Mixtral (4 experts, top-2)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
    )

    torch.manual_seed(seed)
    if family == "gpt2":
        cfg = GPT2Config(
            n_layer=LAYERS,
            n_embd=HIDDEN,
            n_head=HEADS,
            vocab_size=VOCAB,
            n_positions=POSITIONS,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        return GPT2LMHeadModel(cfg)
    if family == "mixtral":
        moe = MixtralConfig(
            num_hidden_layers=LAYERS,
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            intermediate_size=EXPERT_FFN,
            num_local_experts=EXPERTS,
            num_experts_per_tok=TOP_K,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="sdpa",
        )
        return MixtralForCausalLM(moe)
    cfg = LlamaConfig(
        num_hidden_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        intermediate_size=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def _chunks(pp: int, v: int) -> tuple[StagePlan, ...]:
    n = pp * v
    base, spare = divmod(LAYERS, n)
    counts = [base + (1 if i < spare else 0) for i in range(n)]
    ranges, start = [], 1
    for c, count in enumerate(counts):
        first = 0 if c == 0 else start
        last = LAYERS + 1 if c == n - 1 else start + count - 1
        ranges.append(ChunkRange(chunk=c, first_layer=first, last_layer=last))
        start += count
    return tuple(
        StagePlan(stage=s, chunks=tuple(r for r in ranges if r.chunk % pp == s)) for s in range(pp)
    )


def make_plan(
    *,
    family: str = "gpt2",
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp_shard: int | None = None,
    zero: int = 0,
    sp: bool = False,
    schedule: str = "none",
    vpp: int = 1,
    mbs: int = 2,
    nmb: int = 1,
    recompute: tuple[str, ...] = (),
    offload: bool = False,
    precision: str = "fp32",
    optimizer: str = "sgd",
    axis_order: tuple[str, ...] = ("pp", "dp", "cp", "tp"),
) -> Plan:
    """A plan for the tiny model with the given degrees; `recompute` lists the blocks'
    policies (default none). Predictions are placeholders (1 s, 1 GB)."""
    world = dp * tp * pp * cp
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    rc = recompute or ("none",) * LAYERS
    names = ["embedding", *(f"block.{i}" for i in range(LAYERS)), "head"]
    layers = tuple(
        LayerDecision(
            index=i,
            name=n,
            recompute=Recompute(rc[i - 1] if 1 <= i <= LAYERS else "none"),
            kept_bytes=0.0,
            recompute_s=0.0,
        )
        for i, n in enumerate(names)
    )
    num_params = sum(p.numel() for p in tiny_model(family).parameters())
    return Plan(
        schema_version=SCHEMA_VERSION,
        generator="tests",
        feasible=True,
        infeasible_reason="",
        model=ModelInfo(
            name=f"{family}-tiny",
            fingerprint="tests",
            num_params=num_params,
            num_blocks=LAYERS,
            hidden=HIDDEN,
            heads=HEADS,
            kv_heads=HEADS if family == "gpt2" else KV_HEADS,
            vocab=VOCAB,
            experts=EXPERTS if family == "mixtral" else 0,
            module_digest="",
        ),
        cluster=ClusterInfo(
            name=f"{world}xcpu",
            fingerprint="tests",
            accelerator="cpu",
            num_nodes=1,
            gpus_per_node=world,
            num_gpus=world,
        ),
        train=TrainInfo(
            global_batch=dp * mbs * nmb,
            seq_len=SEQ_LEN,
            precision=Precision(precision),
            optimizer=Optimizer(optimizer),
            memory_headroom=0.1,
        ),
        parallelism=Parallelism(
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            expert_tp=tp,
            zero_stage=zero,
            dp_shard=dp if dp_shard is None else dp_shard,
            sequence_parallel=sp,
            virtual_stages=vpp,
            offload_optimizer=offload,
            offload_params=offload and zero == 3,  # FSDP2's CPUOffloadPolicy holds both
        ),
        mesh=Mesh(
            axis_order=tuple(MeshAxis(a) for a in axis_order),
            shape=tuple(sizes[a] for a in axis_order),
        ),
        schedule=Schedule(schedule),
        micro_batch_size=mbs,
        num_microbatches=nmb,
        stages=_chunks(pp, vpp),
        layers=layers,
        recompute_policy=Recompute("per_layer" if len(set(rc)) > 1 else rc[0]),
        predicted=Predicted(
            step_time_s=1.0,
            tokens_per_s=1.0,
            mfu=0.1,
            memory_per_gpu_bytes=1e9,
            memory_capacity_bytes=16e9,
            peak_stage=0,
            memory_breakdown=MemoryBreakdown(
                params_bytes=1e9,
                grads_bytes=0.0,
                optimizer_bytes=0.0,
                activations_bytes=0.0,
                other_bytes=0.0,
            ),
            time_breakdown=TimeBreakdown(
                compute_s=0.0, recompute_s=0.0, comm_s=0.0, bubble_s=0.0, optimizer_s=0.0
            ),
            bubble_fraction=0.0,
            exposed_comm_s=0.0,
            recompute_saved_bytes=0.0,
            replay=Replay(step_time_s=1.0, peak_memory_bytes=1.0, peak_stage=0),
        ),
        runners_up=(),
    )


def write_plans(folder: Path, plans: dict[str, Plan]) -> list[str]:
    """Save plans as ``<name>.json`` (round-tripped by the workers); returns the paths."""
    paths = []
    for name, plan in plans.items():
        path = folder / f"{name}.json"
        save_plan(plan, path)
        paths.append(str(path))
    return paths
