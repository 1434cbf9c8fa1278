"""Solver schedules applied to real models: the simulator's peak against MemTracker's.

What is compared (issue 4, "applied for real"). `profile_chain` measures a model's layers into
a solver `LayerChain`; `solve_checkpoint_dp` plans a schedule within a budget; the executor runs it
(`apply_memory_schedule`); MemTracker (`torch.distributed._tools.mem_tracker`) measures the
training step (forward + backward, no optimizer step). Predicted: `simulate(chain,
solution.ops).peak_bytes`, the chain's peak of the model input, activations, what autograd
saved, activation gradients and transients. Measured: MemTracker's peak total minus the
parameters, parameter gradients and buffers at that instant. Parameter gradients exist before
the step (zeros, accumulated into in place, as in gradient accumulation), so they are static;
`profile_chain` measures under the same convention.

GPT-2 is built from its config class with random weights (no download) and untied input and
output embeddings: tied, autograd keeps the head's contribution to the shared matrix's gradient
(V·h·4 bytes, 154 MB for GPT-2 small) from the head's backward until the embedding's, a buffer
spanning layers that the chain model (per-layer sizes) cannot express.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from paraplan.executor.memory_schedule import (
    MemorySchedule,
    Segment,
    apply_memory_schedule,
    schedule_from_ops,
    schedule_from_solution,
    schedule_ops,
)
from paraplan.planner.solvers import (
    Backward,
    ChainLayer,
    Forward,
    LayerChain,
    Offload,
    Policy,
    Prefetch,
    TensorPart,
    Wait,
    simulate,
    solve_checkpoint_dp,
    uniform_schedule,
)
from paraplan.profiler.chain_export import profile_chain

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BUDGET_FRACTIONS = (0.15, 0.4, 0.7)
"""Budgets tested: min + f * (store-all peak - min), min being the DP's smallest peak."""
REL_TOL = 0.05
"""Acceptance: simulated peak within 5% of the measured one."""
SEED = 1234
STATIC = ("Parameter", "Gradient", "Buffer")
"""MemTracker categories that are not part of the chain model."""

# ---- models as chains -----------------------------------------------------------------------
MLP_WIDTHS = (128, 256, 512, 384, 256, 512, 128, 256, 384, 512, 256, 128) * 2 + (256,)
MLP_BATCH = 512
MLP_CLASSES = 10


class LossHead(nn.Module):
    """Linear classifier and cross-entropy against fixed targets: the chain's last layer."""

    def __init__(self, width: int, classes: int, targets: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(width, classes)
        self.targets = targets

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, width) -> ()
        return nn.functional.cross_entropy(self.fc(h), self.targets)


def mlp_chain() -> tuple[list[nn.Module], torch.Tensor]:
    """24 Linear blocks of varying widths (ReLU and GELU alternate: ReLU saves its output,
    GELU its input) and a loss head: 25 chain layers, and the input (B, 128)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [
        nn.Sequential(nn.Linear(w_in, w_out), nn.GELU() if i % 2 else nn.ReLU())
        for i, (w_in, w_out) in enumerate(itertools.pairwise(MLP_WIDTHS))
    ]
    targets = torch.randint(0, MLP_CLASSES, (MLP_BATCH,))
    layers.append(LossHead(MLP_WIDTHS[-1], MLP_CLASSES, targets))
    return layers, torch.randn(MLP_BATCH, MLP_WIDTHS[0])


class GPT2Embedding(nn.Module):
    """Token and position embeddings and dropout of a Hugging Face GPT-2."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, H)
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)  # (1, T)
        return self.drop(self.wte(ids) + self.wpe(pos))


class GPT2Head(nn.Module):
    """Final norm, LM head and the model's own causal-LM loss against `labels`."""

    def __init__(self, model: nn.Module, labels: torch.Tensor) -> None:
        super().__init__()
        self.ln_f, self.lm_head = model.transformer.ln_f, model.lm_head
        self.loss_function = model.loss_function
        self.vocab = model.config.vocab_size
        self.labels = labels

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> ()
        logits = self.lm_head(self.ln_f(h))  # (B, T, V)
        return self.loss_function(logits, self.labels, vocab_size=self.vocab)


GPT2_CONFIGS = {
    "gpt2-tiny": (
        {
            "model_type": "gpt2",
            "n_layer": 4,
            "n_embd": 128,
            "n_head": 4,
            "vocab_size": 1024,
            "n_positions": 128,
            "tie_word_embeddings": False,
        },
        2,
        64,
    ),
    # GPT-2 small (Radford et al. 2019): GPT2Config() but untied (see the module docstring).
    "gpt2-small": ({"model_type": "gpt2", "tie_word_embeddings": False}, 1, 128),
}
"""name -> (config, batch, sequence length)."""


def gpt2_modules(name: str) -> tuple[list[nn.Module], torch.Tensor]:
    """Embedding, the blocks and the head (with the loss) of a random-weight GPT-2, and token
    ids (B, T); checks the chain computes the model's own loss."""
    from paraplan.profiler.hf import build_model, load_config

    config, batch, seq = GPT2_CONFIGS[name]
    torch.manual_seed(0)
    model = build_model(load_config(config), device="cpu")
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    layers = [GPT2Embedding(model.transformer), *model.transformer.h, GPT2Head(model, ids)]
    with torch.no_grad():
        torch.manual_seed(SEED)
        expected = model(input_ids=ids, labels=ids).loss
        torch.manual_seed(SEED)
        got = nn.Sequential(*layers)(ids)
    torch.testing.assert_close(got, expected)
    return layers, ids


def build(name: str) -> tuple[list[nn.Module], torch.Tensor]:
    return mlp_chain() if name == "mlp" else gpt2_modules(name)


# ---- measuring a step -----------------------------------------------------------------------
def measured_step(module: nn.Module, x: torch.Tensor) -> tuple[float, torch.Tensor, list]:
    """(activation peak, loss, parameter gradients) of one forward+backward under MemTracker.
    Gradients start as zeros; the peak is MemTracker's total minus `STATIC` at that instant."""
    params = list(module.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    tracker = MemTracker()
    tracker.track_external(module, x)
    torch.manual_seed(SEED)  # same dropout masks in every run
    with tracker:
        loss = module(x)
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[x.device]
    static = {key.value: value for key, value in peak.items() if hasattr(key, "value")}
    # The convention holds: gradients were accumulated in place, never reallocated.
    assert static["Gradient"] == grad_bytes
    activation_peak = peak["Total"] - sum(static[k] for k in STATIC)
    return activation_peak, loss.detach(), [p.grad.clone() for p in params]


def budgets(chain: LayerChain) -> list[float]:
    store_all = simulate(chain, uniform_schedule(chain, Policy.STORE_ALL)).peak_bytes
    least = solve_checkpoint_dp(chain, store_all).min_budget_bytes
    return [least + f * (store_all - least) for f in BUDGET_FRACTIONS]


@pytest.mark.parametrize(
    "name", ["mlp", "gpt2-tiny", pytest.param("gpt2-small", marks=pytest.mark.slow)]
)
def test_simulated_peak_matches_memtracker(name: str) -> None:
    layers, x = build(name)
    start = time.perf_counter()
    chain = profile_chain(layers, x, name=name)
    print(f"\n{name}: {len(chain)} layers profiled in {time.perf_counter() - start:.1f} s")
    plain, ref_loss, ref_grads = measured_step(nn.Sequential(*layers), x)
    store_all = simulate(chain, uniform_schedule(chain, Policy.STORE_ALL)).peak_bytes
    print(f"{name} store-all: simulated {store_all / 1e6:.3f} MB, MemTracker {plain / 1e6:.3f} MB")
    assert store_all == pytest.approx(plain, rel=REL_TOL)
    for budget in budgets(chain):
        solution = solve_checkpoint_dp(chain, budget)
        schedule = schedule_from_solution(solution, len(layers))
        assert schedule.checkpointed_layers, "a budget below store-all must recompute something"
        simulated = simulate(chain, solution.ops).peak_bytes
        start = time.perf_counter()
        measured, loss, grads = measured_step(apply_memory_schedule(layers, schedule), x)
        print(
            f"{name} budget {budget / 1e6:.2f} MB: simulated {simulated / 1e6:.3f} MB, "
            f"MemTracker {measured / 1e6:.3f} MB, ratio {simulated / measured:.4f}, "
            f"{len(schedule.checkpointed_layers)} layers recomputed, "
            f"step {time.perf_counter() - start:.1f} s"
        )
        assert simulated <= budget * (1 + 1e-9)
        assert simulated == pytest.approx(measured, rel=REL_TOL)
        # Recomputation replays the same ops with the same RNG state: same numbers.
        torch.testing.assert_close(loss, ref_loss)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want)


def test_offload_moves_saved_tensors_off_device() -> None:
    layers, x = mlp_chain()
    n = len(layers)
    kept, ref_loss, ref_grads = measured_step(
        apply_memory_schedule(layers, MemorySchedule.store_all(n)), x
    )
    everything = MemorySchedule.store_all(n, offload=frozenset(range(n)))
    offloaded, loss, grads = measured_step(apply_memory_schedule(layers, everything), x)
    print(f"\nmlp store-all: {kept / 1e6:.3f} MB kept, {offloaded / 1e6:.3f} MB offloaded")
    # What stays: the input, one layer's tensors brought back and the gradients in flight.
    assert offloaded < 0.25 * kept
    torch.testing.assert_close(loss, ref_loss)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)
    # Offload combined with checkpointing: the stored top-level layers offload. (A fixed
    # schedule: the DP's choice depends on measured times, and may store next to nothing.)
    half = n // 2
    plan = MemorySchedule(
        num_layers=n,
        segments=(Segment(first=0, stop=half, checkpointed=True), Segment(first=half, stop=n)),
    )
    stored = frozenset(range(half, n))
    both = MemorySchedule(num_layers=n, segments=plan.segments, offload=stored)
    alone, _, _ = measured_step(apply_memory_schedule(layers, plan), x)
    combined, loss, grads = measured_step(apply_memory_schedule(layers, both), x)
    print(f"mlp checkpointed: {alone / 1e6:.3f} MB, with offload {combined / 1e6:.3f} MB")
    assert combined < alone
    torch.testing.assert_close(loss, ref_loss)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_offload_on_cuda_uses_pinned_host_memory() -> None:
    layers, x = mlp_chain()
    layers = [layer.cuda() for layer in layers]
    layers[-1].targets = layers[-1].targets.cuda()
    x = x.cuda()
    n = len(layers)
    results = []
    for offload in (frozenset(), frozenset(range(n))):
        module = apply_memory_schedule(layers, MemorySchedule.store_all(n, offload=offload))
        for p in module.parameters():
            p.grad = torch.zeros_like(p)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = module(x)
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        results.append((peak, loss.detach(), [p.grad.clone() for p in module.parameters()]))
    (kept, ref_loss, ref_grads), (offloaded, loss, grads) = results
    assert offloaded < 0.5 * kept
    torch.testing.assert_close(loss, ref_loss)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


# ---- schedules from solver operations -------------------------------------------------------
def synthetic_chain(num_layers: int = 9) -> LayerChain:
    """A heterogeneous chain (sizes in bytes, times in seconds) for the parser tests."""
    sizes = [10.0 + 7 * (i % 4) for i in range(num_layers + 1)]
    return LayerChain(
        layers=tuple(
            ChainLayer(
                name=f"l{i}",
                fwd_s=1.0 + i % 3,
                bwd_s=2.0 + i % 2,
                input_bytes=sizes[i],
                saved_bytes=sizes[i] * (2 + i % 3),
                output_bytes=sizes[i + 1],
                fwd_tmp_bytes=3.0 * (i % 2),
                bwd_tmp_bytes=5.0 * (i % 3),
            )
            for i in range(num_layers)
        )
    )


def test_schedule_round_trips_solver_ops() -> None:
    chain = synthetic_chain()
    n = len(chain)
    nested = 0
    for f in (0.0, 0.1, 0.3, 0.5, 0.8, 1.0):
        lo = solve_checkpoint_dp(chain, 1e9).min_budget_bytes
        hi = simulate(chain, uniform_schedule(chain, Policy.STORE_ALL)).peak_bytes
        solution = solve_checkpoint_dp(chain, lo + f * (hi - lo))
        schedule = schedule_from_solution(solution, n)
        assert schedule_ops(schedule) == list(solution.ops)
        nested += any(seg.inner for seg in schedule.segments)
    assert nested, "some budget should give a tree with nested recomputation"
    for policy in Policy:
        ops = uniform_schedule(chain, policy)
        assert schedule_ops(schedule_from_ops(ops, n)) == ops
    full = schedule_from_ops(uniform_schedule(chain, Policy.FULL_RECOMPUTE), n)
    assert full.checkpointed_layers == frozenset(range(n - 1))
    store_all = uniform_schedule(chain, Policy.STORE_ALL)
    assert MemorySchedule.store_all(n) == schedule_from_ops(store_all, n)
    # Offloads name layers (a node's saved tensor: that layer; its output: the layer reading
    # it); prefetches and waits are implied by the backward.
    transfers = [Offload(node=2, part=TensorPart.SAVED), Offload(node=4), Wait()]
    back = [Prefetch(node=4), Prefetch(node=2, part=TensorPart.SAVED), Wait()]
    with_transfers = store_all[:n] + transfers + store_all[n : n + 2] + back + store_all[n + 2 :]
    schedule = schedule_from_ops(with_transfers, n)
    assert schedule.offload == frozenset({1, 4})
    assert schedule_ops(schedule) == store_all


def test_bad_inputs_name_the_value_and_the_fix() -> None:
    chain = synthetic_chain()
    n = len(chain)
    ops = uniform_schedule(chain, Policy.SQRT_SEGMENTS)
    with pytest.raises(ValueError, match=r"chain has 5 layers.*solve for this chain"):
        schedule_from_ops(ops, 5)
    infeasible = solve_checkpoint_dp(chain, 1.0)
    with pytest.raises(ValueError, match=r"status is 'infeasible'.*smallest budget.*raise"):
        schedule_from_solution(infeasible, n)
    with pytest.raises(ValueError, match=r"has no status and ops"):
        schedule_from_solution(object(), n)
    # Backward of layer 2 before layer 3's: not a Rotor tree.
    swapped = [Forward(node=k) for k in range(1, n + 1)] + [
        Backward(node=k) for k in [n, *range(n - 1, 3, -1), 2, 3, 1]
    ]
    with pytest.raises(ValueError, match=r"not a Rotor tree"):
        schedule_from_ops(swapped, n)
    with pytest.raises(ValueError, match=r"segment 3..8 must start at layer 2"):
        MemorySchedule(num_layers=n, segments=(Segment(first=0, stop=2), Segment(first=3, stop=n)))
    with pytest.raises(ValueError, match=r"last segment .* is checkpointed"):
        MemorySchedule(num_layers=n, segments=(Segment(first=0, stop=n, checkpointed=True),))
    with pytest.raises(ValueError, match=r"offload has layers \[0\].*not checkpointed"):
        MemorySchedule(
            num_layers=n,
            segments=(Segment(first=0, stop=2, checkpointed=True), Segment(first=2, stop=n)),
            offload=frozenset({0}),
        )
    layers = [nn.Linear(4, 4) for _ in range(3)]
    with pytest.raises(ValueError, match=r"schedule is for a chain of 9 layers but 3 modules"):
        apply_memory_schedule(layers, MemorySchedule.store_all(n))
    with pytest.raises(ValueError, match=r"layers\[1\].*not an nn.Module"):
        bad: list = [layers[0], len, layers[2]]
        apply_memory_schedule(bad, MemorySchedule.store_all(3))
    with pytest.raises(ValueError, match=r"layers\[0\] returned a tuple.*wrap it"):
        profile_chain([nn.LSTM(4, 4)], torch.randn(2, 3, 4))
