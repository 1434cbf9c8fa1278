"""The profiler against independent judges: FlopCounterMode, MemTracker, the analytic spec."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import TrainConfig
from paraplan.planner.cost.compute import layer_gemms
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.profile_io import load_profile, save_profile
from paraplan.planner.strategy import Recompute, Strategy
from paraplan.profiler import profile
from paraplan.profiler.chain import find_blocks
from paraplan.profiler.moe import balanced_experts
from paraplan.profiler.tracer import UnsupportedOpError

from .profiler_models import BATCH, SEQ, hf, plain

ALL = ["gpt2", "llama", "bert", "mixtral", "cnn", "mlp"]


def build(name: str):
    """(model, inputs, loss_fn or None)."""
    if name in ("cnn", "mlp"):
        return plain(name)
    model, inputs = hf(name)
    return model, inputs, None


def run_step(model, inputs, loss_fn) -> None:
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    loss = loss_fn(out) if loss_fn else out.loss
    loss.backward()


def batch_of(inputs) -> int:
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs[0]
    return first.shape[0]


@pytest.mark.parametrize("name", ALL)
def test_flops_equal_flopcountermode(name: str) -> None:
    model, inputs, loss_fn = build(name)
    with sdpa_kernel(SDPBackend.MATH):
        prof = profile(model, inputs, loss_fn=loss_fn, repeats=1, warmup=0)
        model.zero_grad(set_to_none=True)
        # the judge runs MoE experts as the profiler does (balanced routing, plain F.linear):
        # Hugging Face's own experts kernels are not counted by FlopCounterMode either
        with balanced_experts(model), FlopCounterMode(display=False) as counter:
            run_step(model, inputs, loss_fn)
    ours = batch_of(inputs) * sum(x.fwd_flops + x.bwd_flops for x in prof.layers)
    judge = counter.get_total_flops()
    print(f"{name}: profiler {ours:.6g} FLOPs, FlopCounterMode {judge:.6g}")
    assert judge > 0
    assert ours == pytest.approx(judge, rel=1e-3)


def test_cpu_fused_attention_is_counted() -> None:
    # FlopCounterMode misses the CPU flash kernel; the profiler must not.
    model, inputs = hf("llama")
    fused = profile(model, inputs, repeats=1, warmup=0)
    with sdpa_kernel(SDPBackend.MATH):
        math = profile(model, inputs, repeats=1, warmup=0)
    block_f, block_m = fused.layers[1], math.layers[1]
    assert block_f.attn_core_fwd_flops > 0
    assert block_f.fwd_flops == pytest.approx(block_m.fwd_flops, rel=1e-9)


def _checkpointed(model, blocks) -> contextlib.AbstractContextManager:
    """Full recompute of every block with torch.utils.checkpoint (restored on exit)."""
    originals = [b.forward for b in blocks]
    for b, fwd in zip(blocks, originals, strict=True):
        b.forward = lambda *a, _f=fwd, **k: checkpoint(_f, *a, use_reentrant=False, **k)

    @contextlib.contextmanager
    def restore():
        try:
            yield
        finally:
            for b, fwd in zip(blocks, originals, strict=True):
                b.forward = fwd

    return restore()


def _measured_peak(model, inputs, loss_fn, recompute: bool) -> float:
    blocks = find_blocks(model).modules
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    tracker = MemTracker()
    tracker.track_external(model, opt)
    ctx = _checkpointed(model, blocks) if recompute else contextlib.nullcontext()
    with ctx, tracker:
        for step in range(2):  # the second step is the steady state (optimizer states exist)
            run_step(model, inputs, loss_fn)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step == 0:
                tracker.reset_mod_stats()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL], ids=["none", "full"])
@pytest.mark.parametrize("name", ["gpt2-small", "llama", "bert", "cnn"])
def test_predicted_peak_matches_memtracker(name: str, recompute: Recompute) -> None:
    model, inputs, loss_fn = build(name)
    prof = profile(model, inputs, loss_fn=loss_fn, repeats=1, warmup=0)
    batch = batch_of(inputs)
    train = TrainConfig(global_batch=batch, seq_len=prof.seq_len, precision="fp32")
    ev = Evaluator(prof, parse_cluster("1xcpu"), train)
    memory, _ = ev.memory(Strategy(dp=1, tp=1, pp=1, micro_batch_size=batch, recompute=recompute))
    # MemTracker sees tensors only: leave out the runtime context the planner adds.
    predicted = memory.total_bytes - ev.acc.runtime_overhead_bytes
    measured = _measured_peak(model, inputs, loss_fn, recompute == Recompute.FULL)
    print(
        f"{name} recompute={recompute}: predicted {predicted / 1e6:.3f} MB, "
        f"MemTracker {measured / 1e6:.3f} MB ({predicted / measured - 1:+.2%})"
    )
    assert predicted == pytest.approx(measured, rel=0.05)


_TINY_LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 3,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}
"""A tiny Llama config (the spec-against-trace cases below)."""


@pytest.mark.parametrize(
    ("config", "spec"),
    [
        (
            {
                "model_type": "gpt2",
                "n_layer": 3,
                "n_embd": 128,
                "n_head": 4,
                "vocab_size": 512,
                "n_positions": 128,
                "activation_function": "gelu_pytorch_tanh",
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "bos_token_id": 0,
                "eos_token_id": 0,
            },
            "gpt:layers=3,hidden=128,heads=4,vocab=512,seq=128,dropout=false,attention=flash",
        ),
        (_TINY_LLAMA, "llama:layers=3,hidden=128,ffn=352,heads=8,kv_heads=2,vocab=512,seq=2048"),
        (  # heads wider than hidden / heads, as Qwen3 and Gemma set them apart
            {**_TINY_LLAMA, "head_dim": 32},
            "llama:layers=3,hidden=128,ffn=352,heads=8,kv_heads=2,head_dim=32,vocab=512,seq=2048",
        ),
    ],
    ids=["gpt2", "llama", "llama-head-dim"],
)
def test_analytic_spec_agrees_with_trace(config: dict, spec: str) -> None:
    from paraplan.profiler.hf import build_model, example_inputs, load_config

    cfg = load_config(config)
    traced = profile(
        build_model(cfg, device="cpu"), example_inputs(cfg, BATCH, SEQ, "cpu"), repeats=1, warmup=0
    )
    analytic = parse_model(spec).to_profile(SEQ, act_bytes=4)

    def flops(p):
        return sum(x.fwd_flops + x.bwd_flops for x in p.layers)

    def acts(p):
        return sum(x.act_tp_bytes + x.act_replicated_bytes for x in p.layers)

    print(
        f"{config['model_type']}: FLOPs {flops(traced) / flops(analytic) - 1:+.3%}, "
        f"activations {acts(traced) / acts(analytic) - 1:+.3%}"
    )
    assert traced.num_params == analytic.num_params
    heads = config.get("num_attention_heads", config.get("n_head", 1))
    width = config.get("head_dim") or config.get("hidden_size", config.get("n_embd", 0)) // heads
    assert traced.head_size == analytic.head_size == width
    # the traced blocks are priced GEMM by GEMM, their shapes read off the head width
    block = next(x for x in traced.layers if x.kind == LayerKind.BLOCK)
    assert layer_gemms(traced, block, tp=1) is not None
    assert [x.kind for x in traced.layers] == [x.kind for x in analytic.layers]
    assert flops(traced) == pytest.approx(flops(analytic), rel=0.02)
    assert acts(traced) == pytest.approx(acts(analytic), rel=0.10)


@pytest.mark.parametrize("name", ["llama", "gpt2", "mixtral"])
def test_meta_mode_equals_measure_mode(name: str) -> None:
    # Mixtral: both modes route the experts as balanced (profiler/moe.py): N*top_k rows.
    # Attention dropout off: with it, the CPU run falls back to the math kernel, while meta
    # mode models the fused kernel a GPU uses (docs/cost-model.md, profiler section).
    overrides = {"attn_pdrop": 0.0} if name == "gpt2" else {}
    real_model, real_inputs = hf(name, **overrides)
    measured = profile(real_model, real_inputs, repeats=1, warmup=0)
    meta_model, meta_inputs = hf(name, device="meta", **overrides)
    meta = profile(meta_model, meta_inputs, mode="meta")
    assert meta.num_params == measured.num_params
    for a, b in zip(meta.layers, measured.layers, strict=True):
        assert a.fwd_flops == pytest.approx(b.fwd_flops)
        assert a.bwd_flops == pytest.approx(b.bwd_flops)
        assert a.act_tp_bytes + a.act_replicated_bytes == pytest.approx(
            b.act_tp_bytes + b.act_replicated_bytes, rel=0.02
        )
        assert a.fwd_time_s is None and b.fwd_time_s is not None and b.fwd_time_s > 0


def test_chain_structure_and_repeated_blocks() -> None:
    model, inputs = hf("llama")
    prof = profile(model, inputs, repeats=2, warmup=1)
    kinds = [x.kind for x in prof.layers]
    assert kinds == [LayerKind.EMBEDDING, LayerKind.BLOCK, LayerKind.BLOCK, LayerKind.HEAD]
    assert prof.num_params == sum(p.numel() for p in model.parameters())
    b0, b1 = prof.layers[1], prof.layers[2]
    assert b0.params == b1.params and b0.fwd_flops == b1.fwd_flops
    assert prof.measured_on == "cpu"
    assert all(x.fwd_time_s is not None and x.fwd_time_s >= 0 for x in prof.layers)
    assert prof.op_graphs and any(g.nodes and any(n.saved for n in g.nodes) for g in prof.op_graphs)
    node = next(n for g in prof.op_graphs for n in g.nodes if "mm" in n.op)
    assert node.fwd_flops > 0


def test_moe_expert_parameters() -> None:
    model, inputs = hf("mixtral")
    prof = profile(model, inputs, repeats=1, warmup=0)
    experts = sum(p.numel() for n, p in model.named_parameters() if "expert" in n)
    assert experts > 0
    assert sum(x.expert_params for x in prof.layers) == experts
    assert prof.experts == 4 and prof.top_k == 2


def test_cnn_chain_is_heterogeneous() -> None:
    model, inputs, loss_fn = plain("cnn")
    prof = profile(model, inputs, loss_fn=loss_fn, repeats=1, warmup=0)
    blocks = [x for x in prof.layers if x.kind == LayerKind.BLOCK]
    assert len(blocks) == 4
    assert len({x.params for x in blocks}) > 1
    assert prof.seq_len == 1 and prof.heads == 1


def test_profile_json_round_trip(tmp_path) -> None:
    model, inputs = hf("gpt2")
    prof = profile(model, inputs, repeats=1, warmup=0)
    path = tmp_path / "profile.json"
    save_profile(prof, path)
    assert load_profile(path) == prof


class _ItemInForward(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            if x.sum().item() > 1e9:  # data-dependent control flow
                x = x * 0
        return x


def test_unsupported_construct_names_module_and_op() -> None:
    with torch.device("meta"):
        model = _ItemInForward()
        x = torch.randn(2, 8)
    with pytest.raises(UnsupportedOpError, match=r"_local_scalar_dense.*module"):
        profile(model, (x,), mode="meta")


def test_progress_bar_runs(capsys) -> None:
    model, inputs = hf("gpt2")
    prof = profile(model, inputs, repeats=1, warmup=0, progress=True)
    assert prof.num_blocks == 2
    assert "profiling" in capsys.readouterr().err


def test_bad_arguments() -> None:
    model, inputs = hf("gpt2")
    with pytest.raises(ValueError, match="mode="):
        profile(model, inputs, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="meta device"):
        profile(model, inputs, mode="meta")
    with pytest.raises(ValueError, match=r"transformer\.nope"):
        profile(model, inputs, blocks="transformer.nope")


_TINY_MOE = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,  # Qwen3-MoE's config reads it as num_experts (its attribute map)
    "num_experts_per_tok": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
"""The sizes of the tiny MoE configs traced below (each adds its family and widths)."""


def test_traced_moe_counts_expert_flops_as_the_spec() -> None:
    """A tiny Hugging Face Mixtral traced on the meta device against the analytic MoE spec of
    the same sizes: parameters equal, forward FLOPs within 1% (before the balanced-routing
    trace the expert FFN was missing: 64% fewer). Backward FLOPs differ by the attention
    backward convention the dense models share (test_analytic_spec_agrees_with_trace)."""
    from paraplan.profiler.hf import profile_hf

    config = {**_TINY_MOE, "model_type": "mixtral", "intermediate_size": 96}
    traced = profile_hf(config, seq_len=64)
    spec = "moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,ffn_kind=swiglu,vocab=512,seq=256"
    analytic = parse_model(spec + ",experts=4,top_k=2").to_profile(64, act_bytes=2)
    assert traced.num_params == analytic.num_params
    fwd = [sum(x.fwd_flops for x in p.layers) for p in (traced, analytic)]
    total = [sum(x.fwd_flops + x.bwd_flops for x in p.layers) for p in (traced, analytic)]
    assert fwd[0] == pytest.approx(fwd[1], rel=0.01)
    assert total[0] == pytest.approx(total[1], rel=0.03)


def test_traced_qwen3_moe_reads_its_head_and_expert_widths() -> None:
    """A tiny Hugging Face Qwen3-MoE (heads wider than hidden / heads, experts sized by
    `moe_intermediate_size` beside a dense `intermediate_size`) traced on the meta device
    against the analytic MoE spec of the same sizes: forward FLOPs equal, parameters apart by
    Qwen3's per-head q/k norms only (2 x head_dim per block, which the spec leaves out), and
    its blocks priced GEMM by GEMM."""
    from paraplan.profiler.hf import profile_hf

    config = {
        **_TINY_MOE,
        "model_type": "qwen3_moe",
        "head_dim": 32,
        "intermediate_size": 384,
        "moe_intermediate_size": 96,
    }
    traced = profile_hf(config, seq_len=64)
    spec = "moe:layers=2,hidden=64,heads=4,kv_heads=2,head_dim=32,ffn=96,ffn_kind=swiglu"
    analytic = parse_model(spec + ",vocab=512,seq=256,experts=4,top_k=2").to_profile(64)
    assert (traced.experts, traced.top_k, traced.ffn, traced.head_size) == (4, 2, 96, 32)
    assert traced.num_params - analytic.num_params == 2 * 32 * 2
    fwd = [sum(x.fwd_flops for x in p.layers) for p in (traced, analytic)]
    assert fwd[0] == pytest.approx(fwd[1], rel=0.01)
    block = next(x for x in traced.layers if x.kind == LayerKind.BLOCK)
    assert layer_gemms(traced, block, tp=1) is not None
