"""What a block keeps for backward under fused norms and a fused SwiGLU (`Runtime.
norm_keeps_input_only`, `glu_keeps_input_only`: Megatron-Core with Transformer Engine) against
eager torch: the copies the cost model leaves out (`LayerCost.act_norm_copy_bytes`,
`act_glu_copy_bytes`) measured with saved-tensor hooks on the real modules (Hugging Face's
Llama MLP and RMSNorm, as the executor runs them; Megatron-Core's own fused SwiGLU), the kept
bytes under Megatron's runtime counted by hand from the model's sizes, and version-9 plans."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Iterable

import pytest
import torch

from paraplan.planner.config import Runtime, TrainConfig
from paraplan.planner.cost.float8 import layer_kept_bytes
from paraplan.planner.frameworks import RUNTIMES, Framework, framework_of
from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import parse_model
from paraplan.planner.plan_io import plan_from_dict
from paraplan.planner.strategy import Recompute

H, F, S = 64, 176, 32
"""A small Llama: hidden, MLP width, tokens."""
ELEM = 4  # fp32 bytes
LLAMA = f"llama:layers=2,hidden={H},heads=4,kv_heads=2,ffn={F},vocab=256,seq={S}"


def _saved_bytes(fn: Callable[[torch.Tensor], torch.Tensor], params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages `fn` saves for backward on a (S, H) input, its weights
    left out (they are not activations)."""
    x = torch.randn(S, H, requires_grad=True)
    weights = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x).sum().backward()
    return sum(seen.values())


def _block():
    profile = parse_model(LLAMA).to_profile(S, act_bytes=ELEM)
    return profile, next(x for x in profile.layers if x.kind == LayerKind.BLOCK)


def test_glu_copy_is_what_megatron_fused_swiglu_does_not_keep() -> None:
    """Hugging Face's LlamaMLP (eager: gate, up, silu(gate) and the product beside its input)
    keeps one ffn-wide tensor per token more than Megatron-Core's fused SwiGLU between the same
    two linears (its `SwiGLUFunction` saves its input, gate and up, alone): the spec's
    `act_glu_copy_bytes`, and its eager MLP count (4 ffn-wide tensors) is the measured one."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core without Transformer Engine says so
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    hf = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=F))
    eager = _saved_bytes(hf, hf.parameters())
    fc1 = torch.nn.Linear(H, 2 * F, bias=False)
    fc2 = torch.nn.Linear(F, H, bias=False)
    fused = _saved_bytes(lambda x: fc2(bias_swiglu_impl(fc1(x), None)), [fc1.weight, fc2.weight])
    assert eager == S * (H + 4 * F) * ELEM  # the input, gate, up, silu(gate), product
    assert fused == S * (H + 3 * F) * ELEM  # the input, gate and up, product
    _, block = _block()
    assert block.act_glu_copy_bytes == eager - fused


def test_norm_copy_is_what_an_unfused_rmsnorm_keeps_beyond_its_input() -> None:
    """Hugging Face's LlamaRMSNorm keeps its input, the normalized copy and the per-token
    rsqrt; Transformer Engine's fused norm keeps the input and the statistics (its source,
    `Runtime.norm_keeps_input_only`): the difference, per block two norms, is the spec's
    `act_norm_copy_bytes` (the head's final norm one)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(H)
    kept = _saved_bytes(norm, norm.parameters())
    stats = S * ELEM  # rsqrt(mean(x^2)) per token, which a fused norm keeps too
    assert kept == S * 2 * H * ELEM + stats
    profile, block = _block()
    copy = kept - S * H * ELEM - stats
    assert block.act_norm_copy_bytes == 2 * copy
    head = next(x for x in profile.layers if x.kind == LayerKind.HEAD)
    assert head.act_norm_copy_bytes == copy


@pytest.mark.parametrize(("tp", "sp", "cp"), [(1, False, 1), (4, True, 1), (4, False, 2)])
def test_megatron_keeps_less_by_the_copies(tp: int, sp: bool, cp: int) -> None:
    """Under Megatron's runtime a block keeps, per sequence, 2 normalized copies (h wide,
    sharded under SP) and one silu(gate) (ffn wide, TP-sharded) less than under paraplan's
    executor; nothing changes under full recompute (only the input is kept)."""
    profile, block = _block()
    eager = dataclasses.replace(RUNTIMES[Framework.MEGATRON], **_EAGER)
    megatron = RUNTIMES[Framework.MEGATRON]

    def kept(runtime: Runtime, recompute: Recompute) -> float:
        return layer_kept_bytes(
            None, profile, block, tp=tp, sp=sp, cp=cp, recompute=recompute, runtime=runtime
        )

    r = tp if sp else 1
    by_hand = (2 * S * H * ELEM / r + S * F * ELEM / tp) / cp
    for recompute in (Recompute.NONE, Recompute.SELECTIVE):
        assert kept(eager, recompute) - kept(megatron, recompute) == pytest.approx(by_hand)
    assert kept(eager, Recompute.FULL) == kept(megatron, Recompute.FULL)


_EAGER = {"norm_keeps_input_only": False, "glu_keeps_input_only": False}


def test_megatron_plan_keeps_less_per_layer() -> None:
    """A Llama plan priced for Megatron, pinned to one shape, keeps per block its two
    normalized copies and its silu(gate) less than the same plan priced with eager torch's
    kernels (the rest of Megatron's runtime alike), and its head its final norm's copy."""
    from paraplan.planner.api import make_plan
    from paraplan.planner.cluster import parse_cluster
    from paraplan.planner.pins import Pins

    profile = parse_model(LLAMA).to_profile(S)
    pins = Pins.parse("dp=1,tp=1,pp=1,cp=1,mbs=1,recompute=none,zero=0")
    eager_rt = dataclasses.replace(RUNTIMES[Framework.MEGATRON], **_EAGER)
    kept = []
    for runtime in (eager_rt, RUNTIMES[Framework.MEGATRON]):
        train = TrainConfig(global_batch=8, seq_len=S, runtime=runtime)
        plan = make_plan(profile, parse_cluster("1xh100"), train, pins=pins).plan
        kept.append([x.kept_bytes for x in plan.layers])
    for layer, eager, fused in zip(profile.layers, *kept, strict=True):
        copies = layer.act_norm_copy_bytes + layer.act_glu_copy_bytes
        assert eager - fused == pytest.approx(copies, rel=1e-12)
        assert copies > 0 or layer.kind == LayerKind.EMBEDDING


def test_version_9_plans() -> None:
    """A version-9 plan of Megatron's or NeMo's runtime reads as that runtime (its fused
    kernels now keep their inputs only); one of paraplan's executor keeps eager torch's."""
    import paraplan

    for runtime in ("megatron", "nemo", "paraplan", "torchtitan", "torchtitan-compile"):
        plan = paraplan.plan(LLAMA, "8xh100", global_batch=8, seq_len=S, runtime=runtime).plan
        doc = json.loads(json.dumps(plan.to_dict()))
        doc["schema_version"] = 9
        for key in _EAGER:
            del doc["train"]["runtime"][key]
        back = plan_from_dict(doc).train.runtime
        assert back == plan.train.runtime
        assert framework_of(back) == Framework(runtime)


def test_torch_compile_keeps_what_the_fused_kernels_keep() -> None:
    """torchtitan's compiled runtimes count a block as Megatron's fused kernels do: a Hugging
    Face RMSNorm and Llama MLP compiled by torch.compile (Inductor, on this CPU) keep neither
    the normalized copy nor silu(gate); eager, both (`act_norm_copy_bytes`,
    `act_glu_copy_bytes`)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    class NormMlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = LlamaRMSNorm(H)
            self.mlp = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=F))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(self.norm(x))

    module = NormMlp()
    eager = _saved_bytes(module, module.parameters())
    try:
        compiled = _saved_bytes(torch.compile(module), module.parameters())
    except Exception as exc:  # no C++ compiler for Inductor's CPU code
        pytest.skip(f"torch.compile does not run here: {type(exc).__name__}")
    _, block = _block()
    per_norm = block.act_norm_copy_bytes / 2  # the block's two norms; this module has one
    assert eager - compiled == per_norm + block.act_glu_copy_bytes
    for name in (Framework.TORCHTITAN_COMPILE, Framework.TORCHTITAN_ASYNC_TP):
        assert RUNTIMES[name].norm_keeps_input_only and RUNTIMES[name].glu_keeps_input_only
    assert not RUNTIMES[Framework.TORCHTITAN].glu_keeps_input_only


def test_traced_profiles_split_out_the_copies() -> None:
    """A traced Hugging Face model carries the copies too, as its eager modules keep them: a
    Llama's silu(gate) equals the spec's (s x ffn per block), its norms' copies are what
    LlamaRMSNorm saves in bf16 beyond its input (the fp32 cast of x and the normalized
    output, less the input a fused norm keeps, measured with saved-tensor hooks), and a
    Mixtral's silu(gate) is one per routed copy (s x top_k x ffn), however the tokens route."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import paraplan

    seq = 64
    traced = paraplan.model_profile("examples/configs/llama-tiny.json", seq_len=seq, source="trace")
    assert traced.act_dtype_bytes == 2 and traced.hidden == H and traced.ffn == F
    block = next(x for x in traced.layers if x.kind == LayerKind.BLOCK)
    assert block.act_glu_copy_bytes == seq * F * 2
    norm = LlamaRMSNorm(H).to(torch.bfloat16)
    x = torch.randn(seq, H, dtype=torch.bfloat16, requires_grad=True)
    sizes: dict[int, tuple[int, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() != norm.weight.untyped_storage().data_ptr():
            sizes[t.untyped_storage().data_ptr()] = (t.numel(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        norm(x)
    big = sum(nbytes for numel, nbytes in sizes.values() if numel >= seq * H)
    copy = big - seq * H * 2  # less the bf16 input a fused norm keeps
    assert copy > 0 and block.act_norm_copy_bytes == 2 * copy
    assert traced.layers[-1].act_norm_copy_bytes == copy  # the final norm
    moe = paraplan.model_profile("examples/configs/mixtral-tiny.json", seq_len=seq, source="trace")
    block = next(x for x in moe.layers if x.kind == LayerKind.BLOCK)
    assert block.act_glu_copy_bytes == seq * moe.top_k * moe.ffn * 2
