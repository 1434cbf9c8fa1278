"""Helpers for the executor tests: tiny models, plans built without the planner's search, and
the torchrun worker that runs the multi-process checks (``python -m torch.distributed.run ...
tests/executor_helpers.py <scenario> <out_dir> <args>``); results come back as JSON files."""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from paraplan.planner.plan import (  # noqa: E402
    SCHEMA_VERSION,
    ChunkRange,
    ClusterInfo,
    LayerDecision,
    MemoryBreakdownJSON,
    Mesh,
    ModelInfo,
    Parallelism,
    Plan,
    Predicted,
    StagePlan,
    TimeBreakdownJSON,
    TrainInfo,
    load_plan,
    save_plan,
)

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB, POSITIONS, FFN = 4, 64, 4, 2, 512, 128, 176
SEQ_LEN = 32
"""Tokens per test sequence."""


def tiny_model(family: str = "gpt2", seed: int = 0) -> torch.nn.Module:
    """A 4-block Hugging Face causal LM (hidden 64, vocab 512), dropout off, seeded."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if family == "gpt2":
        cfg = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, vocab_size=VOCAB,
                         n_positions=POSITIONS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0)  # fmt: skip
        return GPT2LMHeadModel(cfg)
    cfg = LlamaConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=FFN, vocab_size=VOCAB,
                      max_position_embeddings=POSITIONS, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0)  # fmt: skip
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


def make_plan(*, family: str = "gpt2", dp: int = 1, tp: int = 1, pp: int = 1, zero: int = 0,
              sp: bool = False, schedule: str = "none", vpp: int = 1, mbs: int = 2,
              nmb: int = 1, recompute: tuple[str, ...] = (), offload: bool = False,
              precision: str = "fp32", optimizer: str = "sgd",
              axis_order: tuple[str, ...] = ("pp", "dp", "cp", "tp")) -> Plan:  # fmt: skip
    """A plan for the tiny model with the given degrees; `recompute` lists the blocks'
    policies (default none). Predictions are placeholders (1 s, 1 GB)."""
    world = dp * tp * pp
    sizes = {"pp": pp, "dp": dp, "cp": 1, "tp": tp}
    rc = recompute or ("none",) * LAYERS
    names = ["embedding", *(f"block.{i}" for i in range(LAYERS)), "head"]
    layers = tuple(
        LayerDecision(index=i, name=n, recompute=rc[i - 1] if 1 <= i <= LAYERS else "none")
        for i, n in enumerate(names)
    )
    num_params = sum(p.numel() for p in tiny_model(family).parameters())
    return Plan(
        schema_version=SCHEMA_VERSION, generator="tests", feasible=True, infeasible_reason="",
        model=ModelInfo(name=f"{family}-tiny", fingerprint="tests", num_params=num_params,
                        num_blocks=LAYERS, hidden=HIDDEN, heads=HEADS,
                        kv_heads=HEADS if family == "gpt2" else KV_HEADS, vocab=VOCAB,
                        experts=0),
        cluster=ClusterInfo(name=f"{world}xcpu", fingerprint="tests", accelerator="cpu",
                            num_nodes=1, gpus_per_node=world, num_gpus=world),
        train=TrainInfo(global_batch=dp * mbs * nmb, seq_len=SEQ_LEN, precision=precision,
                        optimizer=optimizer, memory_headroom=0.1),
        parallelism=Parallelism(dp=dp, tp=tp, pp=pp, cp=1, ep=1, zero_stage=zero,
                                sequence_parallel=sp, virtual_stages=vpp,
                                offload_optimizer=offload),
        mesh=Mesh(axis_order=axis_order, shape=tuple(sizes[a] for a in axis_order)),
        schedule=schedule, micro_batch_size=mbs, num_microbatches=nmb, stages=_chunks(pp, vpp),
        layers=layers,
        predicted=Predicted(step_time_s=1.0, tokens_per_s=1.0, mfu=0.1, memory_per_gpu_bytes=1e9,
                            memory_capacity_bytes=16e9, peak_stage=0,
                            memory_breakdown=MemoryBreakdownJSON(params_bytes=0.0, grads_bytes=0.0,
                                optimizer_bytes=0.0, activations_bytes=0.0, other_bytes=0.0),
                            time_breakdown=TimeBreakdownJSON(compute_s=0.0, recompute_s=0.0,
                                comm_s=0.0, bubble_s=0.0, optimizer_s=0.0),
                            bubble_fraction=0.0, exposed_comm_s=0.0),
        runners_up=(),
    )  # fmt: skip


def write_plans(folder: Path, plans: dict[str, Plan]) -> list[str]:
    """Save plans as ``<name>.json`` (round-tripped by the workers); returns the paths."""
    paths = []
    for name, plan in plans.items():
        path = folder / f"{name}.json"
        save_plan(plan, path)
        paths.append(str(path))
    return paths


def launch(nproc: int, scenario: str, out_dir: Path, *args: str, timeout_s: float = 240,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run this file's `scenario` under torchrun with `nproc` ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", __file__, scenario, str(out_dir), *args]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env,
                          cwd=ROOT)  # fmt: skip


def synthetic_batch(plan: Plan, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: token ids and next-token labels, (global_batch, T) each."""
    from paraplan.executor.data import synthetic_tokens

    return synthetic_tokens(plan.train.global_batch, plan.train.seq_len, plan.model.vocab,
                            seed=1234, step=step)  # fmt: skip


# ---- worker scenarios (inside torchrun) -------------------------------------------------------


def _numerics_one(path: str) -> dict[str, object]:
    """Parallel loss and gradients against the single-process reference, then one SGD step
    and the next loss."""
    import torch.nn.functional as F

    from paraplan.executor import parallelize
    from paraplan.executor.compose import causal_lm_loss

    plan = load_plan(path)
    family = "llama" if plan.model.name.startswith("llama") else "gpt2"
    model = tiny_model(family)
    ref = copy.deepcopy(model)
    lr = 0.5
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref_losses, ref_grads = [], {}
    for step in range(2):
        x, y = synthetic_batch(plan, step)
        ref_opt.zero_grad()
        loss = causal_lm_loss(ref(x).logits, y)
        loss.backward()
        ref_losses.append(loss.item())
        if step == 0:
            ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        ref_opt.step()
    del F

    pm = parallelize(model, plan, timeout_s=60)
    opt = torch.optim.SGD(list(pm.parameters()), lr=lr)
    losses, grad_err, checked = [], {}, []
    for step in range(2):
        x, y = synthetic_batch(plan, step)
        opt.zero_grad()
        loss = pm.forward_backward(pm.local_batch(x), pm.local_batch(y))
        losses.append(_global_loss(pm, loss))
        if step == 0:
            chain = pm.chains[0]
            grads = chain.hf_names(pm.named_tensors("grad"))
            for name, g in grads.items():
                ref_g = ref_grads[name]
                err = (g - ref_g).abs().max().item() / max(1e-3, ref_g.abs().max().item())
                grad_err[name] = max(grad_err.get(name, 0.0), err)
            checked = sorted(grads)
        opt.step()
    return {"ref_losses": ref_losses, "losses": losses, "grad_rel_err": grad_err,
            "checked": checked}  # fmt: skip


def _global_loss(pm: object, loss: torch.Tensor | None) -> float:
    from paraplan.executor.training import global_loss

    return global_loss(pm, loss)  # type: ignore[arg-type]


def scenario_numerics(out: Path, paths: list[str]) -> None:
    results = {Path(p).stem: _numerics_one(p) for p in paths}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))


def _finish() -> None:
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    scenario, out, args = argv[0], Path(argv[1]), argv[2:]
    t0 = time.perf_counter()
    {"numerics": scenario_numerics}[scenario](out, args)
    if dist.get_rank() == 0:
        print(f"{scenario}: {time.perf_counter() - t0:.1f} s")
    _finish()


if __name__ == "__main__":
    main(sys.argv[1:])
