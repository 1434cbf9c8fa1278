"""A trainer configuration's own split of the blocks over pipeline chunks (`CountSplit`):
Megatron-Core's rules against megatron-core's own `get_num_layers_to_build` and its layout
parser, and `plan --from-config` pricing a configuration with the split it runs."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.export.judge import _difference
from paraplan.export.megatron_read import _layout_blocks
from paraplan.export.setup import TrainerSetup
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.cost.count_split import CountSplit
from paraplan.planner.explain import format_plan
from paraplan.planner.plan import Plan
from tests.export_cases import profile, yours_of

needs_mcore = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None,
    reason="megatron-core not installed (pip install 'paraplan[export]')",
)

SPLITS = [
    CountSplit(),
    CountSplit(embedding_as_layer=True),
    CountSplit(loss_as_layer=True),
    CountSplit(embedding_as_layer=True, loss_as_layer=True),
    CountSplit(first_stage_blocks=2),
    CountSplit(last_stage_blocks=3),
    CountSplit(first_stage_blocks=4, last_stage_blocks=2),
    CountSplit(first_stage_blocks=3, embedding_as_layer=True),  # Megatron refuses the pair
]


def _megatron_counts(split: CountSplit, layers: int, pp: int, v: int) -> list[int] | None:
    """Blocks per model chunk as megatron-core builds them (None: it refuses)."""
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        config = TransformerConfig(
            num_layers=layers,
            hidden_size=64,
            num_attention_heads=4,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=v if v > 1 else None,
            pipeline_dtype=torch.bfloat16,
            num_layers_in_first_pipeline_stage=split.first_stage_blocks,
            num_layers_in_last_pipeline_stage=split.last_stage_blocks,
            account_for_embedding_in_pipeline_split=split.embedding_as_layer,
            account_for_loss_in_pipeline_split=split.loss_as_layer,
        )
        return [
            get_num_layers_to_build(config, vp_stage=c // pp if v > 1 else None, pp_rank=c % pp)
            for c in range(pp * v)
        ]
    except (AssertionError, ValueError):
        return None


@needs_mcore
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.describe())
def test_counts_are_megatron_cores(split: CountSplit) -> None:
    """Over a grid of layer counts, stages and virtual stages: where megatron-core builds the
    chunks, `counts` gives its blocks per chunk (or refuses a chunk without a block, which
    paraplan does not price); where megatron-core refuses, `counts` raises."""
    agreed = refused = 0
    for layers, pp, v in itertools.product((8, 12, 16, 30, 32, 36), (2, 3, 4, 8), (1, 2, 3)):
        want = _megatron_counts(split, layers, pp, v)
        try:
            got = split.counts(layers, pp, v)
        except ValueError:
            got = None
        if want is not None and min(want) < 1:
            assert got is None, (layers, pp, v)  # an empty chunk: refused by paraplan
            continue
        assert got == want, (layers, pp, v)
        agreed += got is not None
        refused += got is None
    assert refused > 0 and (agreed > 0 or split.first_stage_blocks is not None)


@needs_mcore
@pytest.mark.parametrize(
    ("layout", "pp"),
    [("Et*3|t*4|t*4|t*3L", 4), ("E|(tt|)*6,tL", 4), ("Ett|tt|t|tttL", 2), ("Et*2|(t*4|)*2t*2L", 2)],
)
def test_layout_blocks_are_megatron_cores(layout: str, pp: int) -> None:
    """Blocks per chunk of a `--pipeline-model-parallel-layout`, in model order, as megatron-
    core's `PipelineParallelLayerLayout` places them (chunk c on rank c mod pp)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    parsed = PipelineParallelLayerLayout(layout, pp).layout
    v = len(parsed[0])
    want = [parsed[c % pp][c // pp].count(LayerType.decoder) for c in range(pp * v)]
    assert list(_layout_blocks(layout)) == want


def test_torchtitan_module_lists() -> None:
    parts = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2"], ["layers.3", "norm"]]
    assert CountSplit.of_modules(parts) == CountSplit(chunk_blocks=(2, 1, 1))
    assert CountSplit.of_modules(None) is None


def _yours(args: str, tmp_path: Path) -> Plan:
    """`--from-config` of a Megatron argument file on 16 H100s: your configuration's plan."""
    path = tmp_path / "mine.args"
    path.write_text(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 "
        "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 "
        "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform "
        + args
    )
    return yours_of(path)


def _stage_blocks(plan: Plan) -> list[int]:
    last = len(plan.layers) - 1
    return [
        sum(
            c.last_layer - c.first_layer + 1 - (c.first_layer == 0) - (c.last_layer == last)
            for c in st.chunks
        )
        for st in plan.stages
    ]


def test_from_config_prices_megatrons_split(tmp_path: Path) -> None:
    """Llama 3 8B (32 blocks, a 128K-word head) on pp 4: with no layout Megatron builds 8 blocks
    per stage, which your configuration's plan keeps (the cost-balanced cut, which the best
    plan may take and exports as a layout, puts fewer on the head's stage); the last stage's
    count and a layout are kept as given; the even split is slower than the balanced one."""
    even = _yours("", tmp_path)
    assert _stage_blocks(even) == [8, 8, 8, 8]
    assert _stage_blocks(_yours("--decoder-last-pipeline-num-layers 5", tmp_path)) == [9, 9, 9, 5]
    laid = _yours("--pipeline-model-parallel-layout 'Et*9|t*9|t*8|t*6L'", tmp_path)
    assert _stage_blocks(laid) == [9, 9, 8, 6]
    assert "stages        blocks per chunk in model order: 9 (x2), 8, 6" in format_plan(laid)
    assert even.predicted.step_time_s > laid.predicted.step_time_s
    said = "\n".join(_difference(even, laid))  # the same strategy, split otherwise
    assert "is the best plan" not in said
    assert "blocks per pipeline chunk 8,8,8,8 -> 9,9,8,6" in said


def test_from_config_refuses_a_split_megatron_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """30 blocks do not divide over 4 stages: Megatron-Core asserts at start-up; paraplan says
    so before any search (exit 2, one line naming the numbers and the fix)."""
    path = tmp_path / "mine.args"
    path.write_text(
        "--pipeline-model-parallel-size 4 --bf16 --micro-batch-size 1 --global-batch-size 64 "
        "--seq-length 4096 --use-distributed-optimizer"
    )
    model = "gpt:layers=30,hidden=2048,heads=16,vocab=32000,seq=4096"
    argv = ["plan", "--from-config", str(path), "--model", model, "--cluster", "16xh100"]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "30 layers (30 blocks) do not divide over 4 pipeline stages" in err
    assert "--pipeline-model-parallel-layout" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None, reason="torchtitan not installed"
)
def test_torchtitan_module_names_are_its_own() -> None:
    """The exported torchtitan >= 0.3 command line names the modules of each pipeline chunk as
    torchtitan 0.3's own split does (`tok_embeddings`, `layers.i`, `norm`, `lm_head`: the head
    was `output` up to 0.2, which the TOML for those versions keeps), and they give back the
    plan's blocks per chunk."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    from paraplan.export.exporter import Costing, Target, export_plan
    from tests.export_cases import CASES, case_plan

    plan = case_plan("pp_1f1b")
    costing = Costing(profile(), parse_cluster(CASES["pp_1f1b"][0]), plan)
    text = export_plan(plan, Target.TORCHTITAN, costing).text
    words = next(x for x in text.splitlines() if x.startswith("# torchtitan >= 0.3:")).split()
    at = words.index("--parallelism.module-fqns-per-model-part") + 1
    chunks = len(plan.stages) * plan.parallelism.virtual_stages
    parts = [w.split(",") for w in words[at : at + chunks]]
    theirs = _generate_llm_fqn_per_model_part(chunks, len(plan.layers) - 2)
    assert {n for p in parts for n in p} == {n for p in theirs for n in p}
    assert '"norm", "output"]' in text  # the TOML, for torchtitan <= 0.2
    split = CountSplit.of_modules(parts)
    assert split is not None and list(split.chunk_blocks) == _stage_blocks(plan)


@pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None, reason="torchtitan not installed"
)
@pytest.mark.parametrize("weights", [(1, 1), (0, 0), (2, 1), (1, 3)])
def test_torchtitan_automatic_split_is_its_own(weights: tuple[int, int]) -> None:
    """torchtitan's split when a configuration lists no modules (`first/last_stage_less_layers`
    weighing the embedding and head): blocks per chunk as torchtitan 0.3's own function gives
    them, over a grid of layer and chunk counts; where it refuses, `counts` raises too."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    split = CountSplit.of_torchtitan(
        {
            "pipeline_parallel_first_stage_less_layers": weights[0],
            "pipeline_parallel_last_stage_less_layers": weights[1],
        }
    )
    checked = 0
    for layers, chunks in itertools.product((4, 7, 16, 30, 32, 61), (2, 3, 4, 8, 16)):
        try:
            parts = _generate_llm_fqn_per_model_part(chunks, layers, *weights)
            want = [sum(n.startswith("layers.") for n in p) for p in parts]
        except ValueError:
            want = None
        try:
            got = split.counts(layers, chunks, 1)
        except ValueError:
            got = None
        if want is not None and min(want) < 1:
            assert got is None  # a chunk without a block: not priced
            continue
        assert got == want, (layers, chunks)
        checked += got is not None
    assert checked > 10


def test_megatron_shell_script_with_line_continuations() -> None:
    """A launch script as people write it: a command, flags over several lines joined by
    backslashes (a switch at a line's end is still a switch), and the split it asks for noted."""
    text = (
        "torchrun --nproc-per-node 8 pretrain_gpt.py \\\n"
        "  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 \\\n"
        "  --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 \\\n"
        "  --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split\n"
    )
    setup = read_config_text(text)
    assert setup.strategy.tp == 2 and setup.strategy.pp == 2
    assert setup.split == CountSplit(embedding_as_layer=True, loss_as_layer=True)
    assert any(
        "the embedding counted as a block, the loss counted as a block" in n for n in setup.notes
    )


def read_config_text(text: str) -> TrainerSetup:
    """A Megatron argument text read on 16 GPUs."""
    from paraplan.export.megatron import read

    return read(text, world_size=16, source="train.sh")


@pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None, reason="torchtitan not installed"
)
@pytest.mark.parametrize(("name", "looped"), [("1F1B", False), ("Interleaved1F1B", True)])
def test_torchtitan_layers_per_stage_is_its_own(name: str, looped: bool) -> None:
    """`pipeline_parallel_layers_per_stage`: the stages per rank as torchtitan 0.3's own
    `_get_pipeline_metadata` makes them (and refuses them), over layer counts, ranks and
    layers per stage."""
    from types import SimpleNamespace

    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    checked = refused = 0
    grid = itertools.product((16, 30, 32, 80), (2, 4, 8), (1, 2, 3, 4, 5, 8, 9, 11, 17, 41))
    for layers, pp, per in grid:
        par = {"pipeline_parallel_layers_per_stage": per}
        split = CountSplit.of_torchtitan(par)
        theirs = SimpleNamespace(
            pipeline_parallel_schedule=name,
            pipeline_parallel_layers_per_stage=per,
            pipeline_parallel_first_stage_less_layers=1,
            pipeline_parallel_last_stage_less_layers=1,
        )
        try:
            stages = _get_pipeline_metadata(
                SimpleNamespace(pp=pp), theirs, SimpleNamespace(layers=[None] * layers)
            )[0]
        except ValueError:
            stages = None
        try:
            ours = split.virtual_stages(layers, pp, looped=looped)
        except ValueError:
            ours = None
        assert (None if ours is None else ours * pp) == stages, (layers, pp, per)
        checked += ours is not None
        refused += ours is None
    assert checked > 5 and refused > 5


def test_from_config_takes_torchtitans_layers_per_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A torchtitan TOML with `pipeline_parallel_layers_per_stage = 3` and no module lists, on
    Llama 3 8B (32 blocks, the embedding and head weighing 1 each): ceil(34 / 3) = 12 stages
    over pp 2, 6 per rank, priced so; 17 per stage makes 1 per rank, which the looped schedule
    refuses (exit 2, one line)."""
    config = tmp_path / "mine.toml"
    text = (
        "[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 4\n"
        'pipeline_parallel_schedule = "Interleaved1F1B"\n'
        "pipeline_parallel_layers_per_stage = {per}\n"
        "[training]\nlocal_batch_size = 16\nglobal_batch_size = 64\nseq_len = 4096\n"
    )
    argv = ["plan", "--from-config", str(config), "--model", "llama3-8b", "--model-source"]
    argv += ["spec", "--cluster", "8xh100", "--no-progress"]
    config.write_text(text.format(per=3))
    assert main(argv) == 0
    assert "interleaved_1f1b(v=6)" in capsys.readouterr().out
    config.write_text(text.format(per=17))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "makes 2 stages of 32 blocks over 2 pipeline ranks" in err and len(err.splitlines()) == 1


def test_torchtitan_reader_knows_which_schedules_are_looped() -> None:
    """The torchtitan reader builds several stages per rank for exactly the schedules torch
    runs with several (`PipelineScheduleMulti`; torchtitan's default 2 without a module list or
    layers per stage), InterleavedZeroBubble among them, as `--from-config`'s judge does."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    from paraplan.export.torchtitan import _LOOPED, SCHEDULE_NAMES, read_toml

    for schedule, name in SCHEDULE_NAMES.items():
        multi = issubclass(get_schedule_class(name), PipelineScheduleMulti)
        assert (schedule in _LOOPED) == multi, name
        text = (
            f'[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "{name}"\n'
            "[training]\nlocal_batch_size = 8\nseq_len = 2048\n"
        )
        setup = read_toml(text, world_size=8, source="t.toml")
        assert setup.strategy.virtual_stages == (2 if multi else 1), name
