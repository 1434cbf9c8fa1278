"""Multi-token prediction trained beside the decoder (`planner/mtp.py`): the module priced
against the modules transformers and torchtitan build, its place in the pipeline against
megatron-core's own layout, and where the count travels (CLI, plan, exports, older files)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paraplan.planner.cluster import parse_cluster
from paraplan.planner.cost.count_split import CountSplit
from paraplan.planner.model import LayerKind
from paraplan.planner.mtp import with_mtp
from paraplan.planner.plan_io import upgrade
from tests.test_ep_dispatch import GROUPED

MTP_MODEL = {**GROUPED, "num_nextn_predict_layers": 1}
"""A small DeepSeek-V3-style model (latent attention, a dense block then MoE blocks, groups)
declaring one MTP module, as DeepSeek-V3's config.json does."""


@pytest.fixture(scope="module")
def decoder():
    pytest.importorskip("transformers")
    from profiler.hf import profile_hf

    return profile_hf(dict(MTP_MODEL), seq_len=32)


def test_the_config_declares_the_module_and_the_profile_keeps_the_decoder(decoder) -> None:
    assert decoder.mtp_modules == 1
    assert decoder.mtp_blocks == 0 and decoder.decoder_blocks == decoder.num_blocks == 3


def test_module_parameters_match_transformers_mtp_layer(decoder) -> None:
    """The module priced holds what transformers' `MtpLayer` holds for this config (enorm,
    hnorm, eh_proj, the decoder's last block class, the final norm), built on the meta device;
    the embedding and head are shared and count once."""
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config
    from transformers.modeling_layers import MtpModel

    config = DeepseekV3Config(**{k: v for k, v in MTP_MODEL.items() if k != "model_type"})
    with torch.device("meta"):
        main = AutoModelForCausalLM.from_config(config)
        mtp = MtpModel(main, 1)
    built = sum(p.numel() for p in mtp.layers.parameters())
    trained = with_mtp(decoder, 1)
    module = [x for x in trained.layers if x.kind == LayerKind.BLOCK][-1]
    assert module.name == "mtp.0"
    assert module.params + module.expert_params == built
    assert trained.num_params - decoder.num_params == built  # the head's counted once


def test_module_parameters_match_torchtitan_block() -> None:
    """torchtitan's DeepSeek-V3 debug model with one MTP layer (`model_registry(num_mtp_layers
    =1)`): its MTPTransformerBlock's parameters beyond its decoder's last block are the
    projection and three norms, 2 h^2 + 3 h, as priced."""
    pytest.importorskip("torchtitan")
    import torch
    from torchtitan.models.deepseek_v3 import model_registry

    spec = model_registry("debugmodel", num_mtp_layers=1)
    with torch.device("meta"):
        model = spec.model.build()
    last = list(model.layers.values())[-1]
    block = model.mtp_layers[0]
    h = block.eh_proj.weight.shape[1] // 2
    extra = sum(p.numel() for p in block.parameters()) - sum(p.numel() for p in last.parameters())
    assert extra == 2 * h * h + 3 * h


def test_module_adds_a_block_and_a_head_pass(decoder) -> None:
    trained = with_mtp(decoder, 1)
    head, head0 = trained.layers[-1], decoder.layers[-1]
    assert trained.num_blocks == 4 and trained.decoder_blocks == 3 and trained.mtp_blocks == 1
    assert head.fwd_flops == 2 * head0.fwd_flops and head.params == head0.params
    assert head.act_tp_bytes == 2 * head0.act_tp_bytes
    assert with_mtp(trained, 1) is trained
    with pytest.raises(ValueError, match="already trains 1"):
        with_mtp(trained, 2)
    assert trained.fingerprint() != decoder.fingerprint()


def test_recipe_layout_puts_the_module_with_the_loss() -> None:
    """Megatron-Bridge's DeepSeek-V3 H100 recipe runs pp 8 x vp 4 with the layout
    "Et|(tt|)*30mL" (scripts/performance/configs/deepseek, e01f4a3): the last chunk holds the
    MTP module and the loss, no decoder block. megatron-core's own layout parser agrees on
    every chunk's decoder blocks, and paraplan's count puts the module in that chunk."""
    from paraplan.export.megatron_read import _layout_blocks

    layout = "Et|(tt|)*30mL"
    blocks = _layout_blocks(layout)
    counts = CountSplit(chunk_blocks=blocks).counts(61, 8, 4, mtp=1)
    assert counts == [1, *[2] * 30, 1]
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    parsed = PipelineParallelLayerLayout(layout, 8)
    parsed.validate_layer_layout(num_layers=61, mtp_num_layers=1)
    chunks = [parsed.layout[c % 8][c // 8] for c in range(32)]
    assert [c.count(LayerType.decoder) for c in chunks] == list(blocks)
    assert [c.count(LayerType.mtp) for c in chunks] == [0] * 31 + [1]


def test_plan_trains_the_module_on_the_last_stage_and_megatron_reads_it(decoder, tmp_path) -> None:
    """NeMo's runtime trains the model's own module (its recipe sets mtp_num_layers 1): the
    plan records it, its last chunk holds it, the step costs more than the decoder alone, and
    the Megatron-LM file asks for it (megatron-core's config reads it) and prices the same
    step when read back."""
    from paraplan.api import plan as make
    from paraplan.export.exporter import Costing, Target, export_plan
    from paraplan.export.megatron import read

    fix = "dp=4,tp=1,pp=2,ep=4,zero=1,mbs=1,recompute=none,schedule=1f1b"
    kw = dict(global_batch=16, seq_len=32, fix=fix, top_k=0, any_engine=True, runtime="nemo")
    cluster = parse_cluster("8xh100")
    plan = make(decoder, cluster, **kw).plan  # type: ignore[arg-type]
    alone = make(decoder, cluster, mtp_layers=0, **kw).plan  # type: ignore[arg-type]
    assert plan.train.mtp_layers == 1 and alone.train.mtp_layers == 0
    assert plan.model.num_blocks == 3 and len(plan.layers) == 6
    last = max((c for st in plan.stages for c in st.chunks), key=lambda c: c.chunk)
    assert last.first_layer <= 4 <= last.last_layer  # the module (chain index 4) and the head
    assert plan.predicted.step_time_s > alone.predicted.step_time_s
    text = export_plan(plan, Target.MEGATRON, Costing(decoder, cluster, plan)).text
    flags = text.splitlines()
    assert "--mtp-num-layers 1" in flags and "--num-layers 3" in flags
    setup = read(text, world_size=8, source="m.args")
    assert setup.mtp_layers == 1
    pytest.importorskip("megatron.core")
    from tests.export_cases import run_loaders

    path = tmp_path / "mtp.args"
    path.write_text(text)
    core = run_loaders("megatron", [{"path": str(path), "world_size": 8, "dp": 4}])[0]
    assert core["mtp_layers"] == 1


def test_cli_refuses_modules_the_trainer_cannot_run(tmp_path) -> None:
    """Exit 2 and one message before any tracing: modules asked of paraplan's executor, a
    negative count, and torchtitan's MTP with a pipeline (its MTPDecoder has no PP)."""
    model = tmp_path / "m.json"
    model.write_text(json.dumps(MTP_MODEL))
    base = [sys.executable, "-m", "paraplan", "plan", "--model", str(model), "--global-batch", "8"]
    cases = (
        (["--cluster", "2xcpu", "--mtp-layers", "1"], "executor trains no multi-token"),
        (["--cluster", "8xh100", "--runtime", "megatron", "--mtp-layers", "-1"], ">= 0"),
        (
            ["--cluster", "8xh100", "--runtime", "torchtitan", "--mtp-layers", "1", "--fix=pp=2"],
            "without pipeline or context",
        ),
    )
    for extra, said in cases:
        run = subprocess.run(base + extra, capture_output=True, text=True, check=False)
        assert run.returncode == 2, run.stderr
        assert said in run.stderr and "Traceback" not in run.stderr


def test_executor_refuses_a_plan_with_modules(decoder) -> None:
    from paraplan.api import plan as make
    from paraplan.planner.capabilities import plan_gaps

    fix = "dp=8,tp=1,pp=1,ep=1,zero=1,mbs=1,recompute=none,schedule=none"
    kw = dict(global_batch=16, seq_len=32, fix=fix, top_k=0, any_engine=True, runtime="nemo")
    plan = make(decoder, parse_cluster("8xh100"), **kw).plan  # type: ignore[arg-type]
    assert any("multi-token-prediction" in gap for gap in plan_gaps(plan))


def test_older_files_train_no_module(decoder) -> None:
    """A version-14 plan reads as training none, a version-11 profile as declaring none."""
    from paraplan.planner.profile_io import profile_from_dict, profile_to_dict

    assert upgrade({"schema_version": 14, "train": {}})["train"]["mtp_layers"] == 0
    doc = profile_to_dict(decoder)
    doc["schema_version"] = 11
    for key in ("mtp_modules", "mtp_blocks"):
        del doc["profile"][key]
    assert profile_from_dict(doc).mtp_modules == 0
