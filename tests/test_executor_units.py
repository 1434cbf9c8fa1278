"""Executor pieces in one process: model chains, checks, recompute, data, report, launcher."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402

from paraplan.executor.chain import ChainModule  # noqa: E402
from paraplan.executor.checks import check_plan_supported, module_fingerprint  # noqa: E402
from paraplan.executor.compose import causal_lm_loss, parallelize  # noqa: E402
from paraplan.executor.convert import to_chain_module  # noqa: E402
from paraplan.executor.data import synthetic_tokens  # noqa: E402
from paraplan.executor.launch import PLAN_ENV, torchrun_command  # noqa: E402
from paraplan.executor.recompute import apply_recompute  # noqa: E402
from paraplan.executor.report import format_report, make_report  # noqa: E402
from paraplan.planner.plan import Parallelism  # noqa: E402
from paraplan.planner.plan_io import save_plan  # noqa: E402
from paraplan.planner.strategy import Recompute  # noqa: E402
from tests.executor_helpers import LAYERS, make_plan, tiny_model  # noqa: E402


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_chain_matches_hugging_face(family: str) -> None:
    """The chain computes the HF model's logits; its gradients map back to every HF name."""
    model = tiny_model(family)
    ref = copy.deepcopy(model)
    x, y = synthetic_tokens(3, 32, 512, seed=0, step=0)
    ref_loss = causal_lm_loss(ref(x).logits, y)
    ref_loss.backward()
    chain = to_chain_module(model)
    loss = causal_lm_loss(chain(x), y)
    loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    grads = chain.hf_names({n: p.grad for n, p in chain.named_parameters()})
    ref_grads = dict(ref.named_parameters())
    assert sorted(grads) == sorted(ref_grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name].grad, atol=1e-6, rtol=1e-5)
    assert module_fingerprint(chain).num_params == module_fingerprint(ref).num_params


def test_chain_chunks_keep_names() -> None:
    chain = to_chain_module(tiny_model())
    first, last = chain.chunk(0, 2), chain.chunk(3, LAYERS + 1)
    assert first.head is None and last.embed is None
    assert list(first.blocks) == ["0", "1"] and list(last.blocks) == ["2", "3"]
    with pytest.raises(ValueError, match=r"outside 0\.\.5"):
        chain.chunk(0, 9)
    with pytest.raises(ValueError, match="ChainModule"):
        to_chain_module(torch.nn.Linear(2, 2))


def test_fingerprint_counts_tied_matrix_once() -> None:
    model = tiny_model()
    fp = module_fingerprint(model)
    assert fp.num_params == make_plan().model.num_params == 241024  # planner's gpt: spec count
    assert fp == module_fingerprint(tiny_model(seed=1))  # weights do not matter, shapes do
    assert fp.digest != module_fingerprint(tiny_model("llama")).digest


def _forward_ops_in_backward(chain: ChainModule) -> tuple[int, int]:
    """(attention kernels, layer norms) run forward during backward, i.e. recomputed."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"attn": 0, "norm": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            name = func.overloadpacket.__name__
            if name.startswith("_scaled_dot_product") and "backward" not in name:
                counts["attn"] += 1
            elif name == "native_layer_norm":
                counts["norm"] += 1
            return func(*args, **(kwargs or {}))

    x, y = synthetic_tokens(2, 64, 512, seed=0, step=0)
    loss = causal_lm_loss(chain(x), y)
    with Count():
        loss.backward()
    return counts["attn"], counts["norm"]


def test_recompute_policies() -> None:
    """none recomputes nothing; selective the attention core of each block; full the whole
    block (its two LayerNorms too). Gradients are unchanged."""
    expected = {
        Recompute.NONE: (0, 0),
        Recompute.SELECTIVE: (LAYERS, 0),
        Recompute.FULL: (LAYERS, 2 * LAYERS),
    }
    grads = {}
    for policy, counts in expected.items():
        chain = to_chain_module(tiny_model())
        count = apply_recompute(chain, {i: policy for i in range(1, LAYERS + 1)})
        assert count == (0 if policy == Recompute.NONE else LAYERS)
        assert _forward_ops_in_backward(chain) == counts
        grads[policy] = {n: p.grad for n, p in chain.named_parameters()}
    for policy in (Recompute.SELECTIVE, Recompute.FULL):
        for name, g in grads[policy].items():
            torch.testing.assert_close(g, grads[Recompute.NONE][name])


def test_refused_before_any_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """World size, model and device mismatches raise ValueError with no process group."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    cases = [
        (make_plan(dp=4), tiny_model(), "for 4 ranks .* world size 2; launch with torchrun"),
        (make_plan(dp=2, family="llama"), tiny_model(), "241,024 parameters .* 250,432"),
    ]
    plan = make_plan(dp=2)
    gpu = replace(plan, cluster=replace(plan.cluster, accelerator="h100"))
    if not torch.cuda.is_available():
        cases.append((gpu, tiny_model(), "CUDA is not available"))
    dropout = tiny_model()
    dropout.transformer.drop.p = 0.1
    cases.append((make_plan(tp=2), dropout, "dropout p=0.1 in embed.drop .* embd_pdrop"))
    cp_pp = make_plan(cp=2, pp=2, schedule="1f1b", nmb=2, mbs=1)  # outside the capability table
    cases.append((cp_pp, tiny_model(), "cannot run this plan: cp=2 with pp=2"))
    for bad, model, message in cases:
        with pytest.raises(ValueError, match=message):
            parallelize(model, bad)
        assert not dist.is_initialized()


def test_supported_checks_name_the_fix() -> None:
    plan = make_plan(dp=2)
    bad: list[tuple[object, str]] = [
        (replace(plan, train=replace(plan.train, precision="fp16")), "--precision bf16"),
        (replace(plan, train=replace(plan.train, precision="fp8")), "fp8 linear layers"),
        (replace(plan, train=replace(plan.train, optimizer="adam8bit")), "--optimizer"),
        (replace(plan, parallelism=replace(plan.parallelism, offload_optimizer=True)), "zero=2"),
        (replace(plan, parallelism=replace(plan.parallelism, tp=2)), "cluster.s 2 GPUs"),
    ]
    for p, message in bad:
        with pytest.raises(ValueError, match=message):
            check_plan_supported(p)  # type: ignore[arg-type]
    assert isinstance(plan.parallelism, Parallelism)


def test_synthetic_tokens_deterministic_and_shifted() -> None:
    x, y = synthetic_tokens(4, 16, 512, seed=3, step=7)
    x2, _ = synthetic_tokens(4, 16, 512, seed=3, step=7)
    x3, _ = synthetic_tokens(4, 16, 512, seed=3, step=8)
    assert torch.equal(x, x2) and not torch.equal(x, x3)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_report_json_and_table(tmp_path: os.PathLike[str]) -> None:
    plan = make_plan(dp=2, zero=3, recompute=("full",) * LAYERS)
    report = make_report(
        plan,
        step_times_s=[0.3, 0.1, 0.2],
        warmup_steps=2,
        memory_bytes=[2e9, 1.5e9],
        memory_source="RSS",
        device="cpu",
        first_step=0,
        losses=[6.0, 5.5],
    )
    assert report.step_time_s == 0.2 and report.tokens_per_s == pytest.approx(128 / 0.2)
    assert report.step_time_rel_err == pytest.approx(-0.8)
    assert report.memory_rel_err == pytest.approx(1.0)
    path = os.path.join(tmp_path, "r.json")
    report.save(path)
    with open(path) as fh:
        assert json.load(fh)["peak_memory_bytes"] == [2e9, 1.5e9]
    table = format_report(report)
    # memory in GiB as every output (1.5e9 B = 1.397 GiB), not MB
    # the spread of the timed steps beside their median (0.1 to 0.3 s)
    assert "step times from 0.100 s to 0.300 s over the timed steps" in table
    for text in ("step time (median)", "-80.0%", "rc=full", "r1 1.397", "1.863 GiB", "RSS"):
        assert text in table
    assert " MB" not in table
    with pytest.raises(ValueError, match="warm-up"):
        make_report(
            plan,
            step_times_s=[],
            warmup_steps=2,
            memory_bytes=[1.0],
            memory_source="RSS",
            device="cpu",
            first_step=0,
            losses=[],
        )


def test_torchrun_command(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "p.json")
    save_plan(make_plan(dp=2, tp=2), path)
    cmd = torchrun_command(path, "examples/train_gpt2.py", ["--steps", "3"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert cmd[-3:] == ["examples/train_gpt2.py", "--steps", "3"]
    assert PLAN_ENV == "PARAPLAN_PLAN"
    with pytest.raises(ValueError, match="does not exist"):
        torchrun_command(path, "no/such/script.py")
