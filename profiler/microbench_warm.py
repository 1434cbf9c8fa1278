"""What a training rank's first step leaves resident, warmed before a calibration reads the
resident memory it prices as the runtime's (`microbench_run`)."""

from __future__ import annotations

import contextlib
import gc

import torch

from .env import quiet_transformers


def warm_training_runtime() -> None:
    """A tiny forward, backward and AdamW step, then free everything: what a training rank's
    first step leaves resident besides its tensors (autograd's engine, the optimizer's foreach
    kernels, oneDNN/BLAS scratch; about 16 MiB on this CPU, measured with
    `host_memory.live_resident_bytes` before and after), and one step of a one-layer GPT-2
    and Llama from the modeling library the executor trains: the code pages and per-op state
    of the kernels a transformer step touches that a Linear's does not (embedding, norms,
    attention, the loss; 9.4 MB more on this CPU, 2026-11-26, where the executor's first
    step of GPT-2 tiny left ~8 MB beyond its tensors and GEMM kernels unpriced)."""
    models: list[torch.nn.Module] = [
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    ]
    quiet: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    with contextlib.suppress(ImportError):
        models += _one_layer_transformers()
        quiet = quiet_transformers()
    with quiet:
        for model in models:
            opt = torch.optim.AdamW(model.parameters())
            if isinstance(model, torch.nn.Sequential):
                model(torch.randn(8, 64)).sum().backward()
            else:
                ids = torch.randint(0, 64, (2, 32))
                model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            del opt
    del models
    gc.collect()


def _one_layer_transformers() -> list[torch.nn.Module]:
    """One-layer GPT-2 and Llama of the modeling library, fp32, in training mode."""
    import transformers

    gpt2 = transformers.GPT2Config(
        n_layer=1,
        n_embd=64,
        n_head=4,
        vocab_size=64,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    llama = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
    return [
        transformers.GPT2LMHeadModel(gpt2).train(),
        transformers.LlamaForCausalLM(llama).train(),
    ]
