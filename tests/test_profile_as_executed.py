"""A traced profile prices the module the executor runs, not Hugging Face's: GPT-2's block
as the executor converts it (separate q, k, v Linears; Linears for Conv1D) and Llama's block
with its own rotary embedding. The expected difference from Hugging Face's block is counted
here on the CPU with a plain dispatch mode over both blocks, not by the tracer."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import paraplan
from paraplan.executor.convert import executed_module, to_chain_module
from paraplan.profiler import profile
from paraplan.profiler.chain import module_digest
from paraplan.profiler.hf import build_model, example_inputs, load_config, profile_hf
from paraplan.profiler.shape import shape_of

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
SEQ = 32


class _Count(TorchDispatchMode):
    """Operators the model's code dispatches (as the tracer counts: no prim queries, and no
    detach, which only the tracer's own hooks add)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func._overloadpacket)
        if not (name.startswith("prim.") or name == "aten.detach"):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _fwd_ops(run) -> int:  # type: ignore[no-untyped-def]
    with _Count() as count:
        run()
    return sum(count.ops.values())


@pytest.mark.parametrize("config", ["gpt2-tiny.json", "llama-tiny.json"])
def test_block_is_priced_as_the_executor_runs_it(config: str) -> None:
    """The block's operators, parameter tensors and parameters in the traced profile follow
    the executor's block: its operators exceed Hugging Face's block by what the executor's
    block dispatches beyond it (counted directly; the tracer's own count of a block carries
    the same small offset for both, the views at its segment boundary)."""
    path = str(CONFIGS / config)
    cfg = load_config(path)
    hf = build_model(cfg, device="cpu", dtype=torch.float32)
    digest = module_digest(hf)  # Hugging Face's parameter names: what users hand the executor
    x = torch.randn(2, SEQ, shape_of(cfg).hidden, requires_grad=True)
    hf_block = _hf_blocks(hf)[0]
    if config.startswith("gpt2"):
        hf_ops = _fwd_ops(lambda: hf_block(x))
    else:  # Llama's layer takes the rotary embedding the model computes once
        rope = hf.model.rotary_emb(x, torch.arange(SEQ)[None])
        hf_ops = _fwd_ops(lambda: hf_block(x, position_embeddings=rope))
    hf_traced = profile(
        copy.deepcopy(hf), example_inputs(cfg, 2, SEQ, "cpu"), mode="measure", repeats=0
    ).layers[1]
    chain = to_chain_module(copy.deepcopy(hf))
    block = next(iter(chain.blocks.values()))
    executed_ops = _fwd_ops(lambda: block(x))

    traced_profile = paraplan.model_profile(path, seq_len=SEQ, precision="fp32")  # front door
    traced = traced_profile.layers[1]
    assert traced_profile.seq_len == SEQ and traced_profile.module_digest == digest
    assert executed_ops > hf_ops  # q, k, v apart (GPT-2); the rotary in each block (Llama)
    assert traced.fwd_ops - hf_traced.fwd_ops == executed_ops - hf_ops
    assert traced.param_tensors == len(list(block.parameters()))
    assert traced.params == sum(p.numel() for p in block.parameters())
    if config.startswith("gpt2"):  # the conversion adds tensors: q, k, v's weights and biases
        assert traced.param_tensors == len(list(hf_block.parameters())) + 4


def _hf_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = getattr(model, "transformer", None) or model.model  # GPT-2 / Llama
    return inner.h if hasattr(inner, "h") else inner.layers


def test_profile_hf_alone_traces_the_module_as_built() -> None:
    """Without `as_run` the profiler traces Hugging Face's module (the profiler does not
    import the executor); with the executor's `executed_module`, the executor's."""
    path = str(CONFIGS / "gpt2-tiny.json")
    built = profile_hf(path, seq_len=SEQ, dtype=torch.float32).layers[1]
    run = profile_hf(path, seq_len=SEQ, dtype=torch.float32, as_run=executed_module).layers[1]
    assert (built.param_tensors, run.param_tensors) == (12, 16)  # c_attn -> q, k, v (+4)
