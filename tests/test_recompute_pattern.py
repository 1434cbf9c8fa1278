"""A trainer configuration's own choice of recomputed blocks (`RecomputePattern`), and the
trainer flags that change what a configuration is priced as: torchtitan <= 0.2's
`selective_ac_option`, Megatron-LM's `--recompute-activations`, `--recompute-method block`,
its model sizes and its activation offload."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.export.judge import read_config
from paraplan.export.megatron import block_pattern
from paraplan.export.torchtitan import read_registry, read_toml, render
from paraplan.planner.api import make_plan
from paraplan.planner.cluster import parse_cluster
from paraplan.planner.config import RecomputeModule, TrainConfig
from paraplan.planner.cost.count_split import CountSplit
from paraplan.planner.cost.evaluate import Evaluator
from paraplan.planner.cost.memory_totals import memory_totals
from paraplan.planner.cost.recompute_pattern import PatternRule, RecomputePattern
from paraplan.planner.frameworks import RUNTIMES, Framework
from paraplan.planner.model_parse import parse_model
from paraplan.planner.pins import Pins
from paraplan.planner.plan import Plan
from paraplan.planner.strategy import Recompute, Schedule, Strategy
from tests.export_cases import SEQ, profile, yours_of

FULL, NONE = Recompute.FULL, Recompute.NONE


def _blocks(plan_or_policies: tuple[Recompute, ...]) -> list[int]:
    """Indices of the fully recomputed blocks (chain layer i is block i - 1)."""
    return [i - 1 for i, p in enumerate(plan_or_policies) if p == FULL]


def _policies(pattern: RecomputePattern, pp: int, v: int, split: CountSplit | None = None):
    prof = parse_model("gpt:layers=8,hidden=256,heads=4,vocab=1024,seq=128").to_profile(128)
    ev = Evaluator(prof, parse_cluster("8xh100"), TrainConfig(global_batch=8, seq_len=128))
    if split is not None:
        ev = Evaluator(prof, ev.cluster, ev.train, split)
    schedule = Schedule.NONE if pp == 1 else Schedule.INTERLEAVED_1F1B
    lay = ev.stage_model.layout(pp, v, Recompute.PER_LAYER, 1, False, schedule)
    return pattern.policies(prof, ev.stage_model.chunks(lay))


def test_torchtitans_count_runs_over_each_ranks_blocks() -> None:
    """torchtitan 0.2's `_apply_layer_sac` checkpoints a block when its process-wide count
    (from 1) is a multiple of N; a pipeline rank counts the blocks of its own chunks in model
    order. Worked by hand for 8 blocks: on one rank every 3rd is blocks 2 and 5; over pp 2 with
    2 looped chunks of 2 blocks each (rank 0 runs blocks 0, 1, 4, 5; rank 1 blocks 2, 3, 6,
    7), the 3rd block of each rank is 4 and 6."""
    every3 = RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, 3)
    assert _blocks(_policies(every3, 1, 1)) == [2, 5]
    even = CountSplit(chunk_blocks=(2, 2, 2, 2))
    assert _blocks(_policies(every3, 2, 2, even)) == [4, 6]
    every2 = RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, 2)
    assert _blocks(_policies(every2, 1, 1)) == [1, 3, 5, 7]
    # Megatron's block method: the first k blocks of every chunk (chunks 3, 1, 2, 2 blocks)
    first2 = RecomputePattern(PatternRule.FIRST_OF_CHUNK, 2)
    chunks = CountSplit(chunk_blocks=(3, 1, 2, 2))  # blocks 0-2, 3, 4-5, 6-7
    assert _blocks(_policies(first2, 2, 2, chunks)) == [0, 1, 3, 4, 5, 6, 7]
    assert first2.describe() == "the first 2 blocks of every pipeline chunk fully recomputed"
    assert every3.describe() == "every 3rd block of each pipeline rank fully recomputed"
    with pytest.raises(ValueError, match="at least 1"):
        RecomputePattern(PatternRule.FIRST_OF_CHUNK, 0)


_TRAIN = TrainConfig(global_batch=8, seq_len=SEQ, runtime=RUNTIMES[Framework.TORCHTITAN])


def _pinned(pattern: RecomputePattern | None, recompute: Recompute) -> Plan:
    """Llama 3 8B on 8 H100s, FSDP, one micro-batch of 1 at `SEQ`: every dimension pinned."""
    s = Strategy(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1, recompute=recompute)
    outcome = make_plan(
        profile(),
        parse_cluster("8xh100"),
        _TRAIN,
        pins=Pins.of(s),
        top_k=0,
        any_engine=True,
        within_framework=False,  # torchtitan's space has no per_layer (the judge's way too)
        pattern=pattern,
    )
    return outcome.plan


def test_a_pattern_is_priced_as_the_blocks_it_names() -> None:
    """Every 2nd of Llama 3 8B's 32 identical blocks recomputed: half of full recompute's
    seconds, and half of the activation bytes full recompute frees. Recompute none fits here
    (the search's shortcut prices `per_layer` as none when none fits: not so for a trainer's
    own blocks, which it recomputes whatever fits: `memory_totals` leaves it to the caller)."""
    none, full = _pinned(None, NONE), _pinned(None, FULL)
    half = _pinned(RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, 2), Recompute.PER_LAYER)
    assert none.feasible and none.predicted.time_breakdown.recompute_s == 0.0
    assert _blocks(tuple(d.recompute for d in half.layers)) == list(range(1, 32, 2))
    assert half.predicted.time_breakdown.recompute_s == pytest.approx(
        full.predicted.time_breakdown.recompute_s / 2, rel=1e-9
    )
    freed = (
        none.predicted.memory_breakdown.activations_bytes
        - full.predicted.memory_breakdown.activations_bytes
    )
    assert freed > 0
    assert (
        none.predicted.memory_breakdown.activations_bytes
        - half.predicted.memory_breakdown.activations_bytes
        == pytest.approx(freed / 2, rel=1e-6)
    )
    solved = _pinned(None, Recompute.PER_LAYER)  # the solver: nothing, as none fits
    assert solved.predicted.time_breakdown.recompute_s == 0.0
    s = Strategy(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1)
    choices = ((False, 3, False, NONE), (False, 3, False, Recompute.PER_LAYER))
    for pattern in (None, RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, 2)):
        ev = Evaluator(profile(), parse_cluster("8xh100"), _TRAIN, pattern=pattern)
        plain, per_layer = memory_totals(ev, s, choices)
        assert plain is not None and plain <= ev.capacity_bytes
        assert per_layer == (plain if pattern is None else None)


def _toml(ac: str) -> str:
    return (
        "[parallelism]\ndata_parallel_shard_degree = 8\n[training]\nlocal_batch_size = 1\n"
        f"seq_len = {SEQ}\n[activation_checkpoint]\n{ac}"
    )


@pytest.mark.parametrize(
    ("ac", "recompute", "pattern"),
    [
        ('mode = "selective"\n', Recompute.PER_LAYER, 2),  # torchtitan <= 0.2's default "2"
        ('mode = "selective"\nselective_ac_option = "op"\n', Recompute.SELECTIVE, None),
        ('mode = "selective"\nselective_ac_option = "3"\n', Recompute.PER_LAYER, 3),
        ('mode = "selective"\nselective_ac_option = "1"\n', FULL, None),
        ('mode = "selective"\nselective_ac_option = "0"\n', FULL, None),
        ("", Recompute.PER_LAYER, 2),  # no section: the default mode and option
        ('mode = "full"\nselective_ac_option = "2"\n', FULL, None),  # read only for selective
    ],
)
def test_torchtitan_selective_ac_option(ac: str, recompute: Recompute, pattern: int | None) -> None:
    setup = read_toml(_toml(ac), world_size=8, source="job.toml")
    assert setup.strategy.recompute == recompute
    if pattern is None:
        assert setup.pattern is None
    else:
        assert setup.pattern == RecomputePattern(PatternRule.EVERY_NTH_OF_RANK, pattern)
        assert any(f"selective_ac_option = {pattern}: every" in n for n in setup.notes)


def test_torchtitan_bad_option_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "job.toml"
    path.write_text(_toml('mode = "selective"\nselective_ac_option = "some"\n'))
    argv = ["plan", "--from-config", str(path), "--model", "llama3-8b", "--cluster", "8xh100"]
    assert main([*argv, "--model-source", "spec", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "selective_ac_option 'some'" in err and "'op'" in err and len(err.splitlines()) == 1


def test_torchtitan_export_names_per_operator_checkpointing() -> None:
    """A selective plan's TOML says `selective_ac_option = "op"`: torchtitan <= 0.2 would read
    its absence as every 2nd block checkpointed, another policy than the one priced."""
    plan = _pinned(None, Recompute.SELECTIVE)
    text = render(plan, plan.strategy())
    assert 'selective_ac_option = "op"' in text
    assert read_toml(text, world_size=8, source="x").strategy.recompute == Recompute.SELECTIVE
    full = _pinned(None, FULL)
    assert "selective_ac_option" not in render(full, full.strategy())


def _megatron(tmp_path: Path, args: str) -> Path:
    path = tmp_path / "train.sh"
    path.write_text(
        "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size "
        "2 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --bf16 "
        f"--micro-batch-size 1 --global-batch-size 64 --seq-length {SEQ} "
        "--use-distributed-optimizer " + args
    )
    return path


def test_megatron_recompute_activations_is_selective(tmp_path: Path) -> None:
    """Megatron-LM's `--recompute-activations` sets `recompute_granularity = 'selective'`
    (megatron/training/arguments.py, validate_args): the attention core, as
    `--recompute-granularity selective` alone. It was read as no recompute."""
    path = _megatron(tmp_path, "--recompute-activations")
    setup = read_config(str(path), world_size=16)
    assert setup.strategy.recompute == Recompute.SELECTIVE
    assert setup.runtime_says is not None
    assert setup.runtime_says.recompute_modules == (RecomputeModule.CORE_ATTN,)
    same = read_config(str(_megatron(tmp_path, "--recompute-granularity selective")), world_size=16)
    assert same.strategy == setup.strategy and same.runtime_says == setup.runtime_says
    # Megatron-LM before 2022 (the 2021 runs' scripts): every layer recomputed, noted
    old = read_config(str(_megatron(tmp_path, "--checkpoint-activations")), world_size=16)
    assert old.strategy.recompute == Recompute.FULL
    assert any("--checkpoint-activations" in n for n in old.notes)


def test_megatron_block_method_is_priced_and_written_back(tmp_path: Path) -> None:
    """`--recompute-method block --recompute-num-layers 3` on pp 2: the first 3 blocks of each
    16-block chunk recomputed, as the export's own reading of a plan (`block_pattern`) finds
    them, at 3/16 of full recompute's seconds."""
    path = _megatron(
        tmp_path,
        "--recompute-granularity full --recompute-method block --recompute-num-layers 3",
    )
    yours = yours_of(path)
    assert yours.strategy().recompute == Recompute.PER_LAYER
    assert block_pattern(yours) == 3
    assert _blocks(tuple(d.recompute for d in yours.layers)) == [0, 1, 2, 16, 17, 18]
    full = yours_of(_megatron(tmp_path, "--recompute-granularity full --recompute-method uniform"))
    assert yours.predicted.time_breakdown.recompute_s == pytest.approx(
        full.predicted.time_breakdown.recompute_s * 3 / 16
    )


def test_megatron_model_sizes_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A configuration for another model than the one planned is refused (exit 2, one line
    naming the flag and both values); Llama 3 8B's own sizes pass, its 8 key/value heads
    counted only under `--group-query-attention`."""
    base = ["plan", "--model", "llama3-8b", "--model-source", "spec", "--cluster", "16xh100"]
    for args, wrong in (
        ("--num-layers 40", "--num-layers gives blocks 40, but"),  # overrides the 32 of `_megatron`
        (
            "--group-query-attention --num-query-groups 4",
            "--num-query-groups gives key/value heads 4, but",
        ),
        ("--ffn-hidden-size 11008", "--ffn-hidden-size gives MLP size 11008, but"),
        # Megatron-LM's own size without the flag: 4h x 2/3 under --swiglu, to a multiple of 64
        ("--swiglu", "no --ffn-hidden-size gives MLP size 10880, but"),
    ):
        text = _megatron(tmp_path, "").read_text().replace("--num-layers 32 ", "")
        extra = args if "num-layers" in args else f"--num-layers 32 {args}"
        (tmp_path / "bad.sh").write_text(f"{text} {extra}")
        assert main([*base, "--from-config", str(tmp_path / "bad.sh"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert wrong in err and "llama3-8b has" in err and len(err.splitlines()) == 1
    # a configuration stating its model without --num-experts builds a dense one
    dense = read_config(str(_megatron(tmp_path, "")), world_size=16).model_says
    moe = parse_model("mixtral-8x7b").to_profile(SEQ, act_bytes=2)
    assert dense is not None and "no --num-experts gives experts 0" in str(dense.mismatch(moe))
    good = _megatron(
        tmp_path, "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336"
    )
    assert main([*base, "--from-config", str(good), "--no-progress"]) == 0
    capsys.readouterr()


def test_megatron_activation_offload(tmp_path: Path) -> None:
    """`--cpu-offloading-num-layers`: Megatron-Core refuses it with pipeline parallelism or
    recomputation (`TransformerConfig.__post_init__`), so does the reader; otherwise a note
    says it is not priced."""
    with pytest.raises(ValueError, match="Megatron-Core refuses"):
        read_config(str(_megatron(tmp_path, "--cpu-offloading-num-layers 4")), world_size=16)
    text = _megatron(tmp_path, "--cpu-offloading-num-layers 4").read_text()
    one = tmp_path / "one.sh"
    one.write_text(
        text.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
    )
    setup = read_config(str(one), world_size=16)
    assert any("--cpu-offloading-num-layers 4 not priced" in n for n in setup.notes)
    # every flag that sets a recompute granularity counts, the pre-2022 one too
    for flag in ("--recompute-activations", "--checkpoint-activations"):
        both = tmp_path / "both.sh"
        both.write_text(
            one.read_text().replace(
                "--cpu-offloading-num-layers 4", f"--cpu-offloading-num-layers 4 {flag}"
            )
        )
        with pytest.raises(ValueError, match="Megatron-Core refuses"):
            read_config(str(both), world_size=16)


def test_torchtitan_model_flavor_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """torchtitan <= 0.2's `[model] flavor` names Llama 3's sizes (its `llama3_args`): "70B"
    judged on Llama 3 8B is refused (exit 2, one line); "8B" passes; a flavor paraplan does
    not know is not checked."""
    base = ["plan", "--model", "llama3-8b", "--model-source", "spec", "--cluster", "8xh100"]
    for flavor, code in (("70B", 2), ("8B", 0), ("mine", 0)):
        path = tmp_path / "job.toml"
        path.write_text(f'[model]\nname = "llama3"\nflavor = "{flavor}"\n' + _toml(""))
        assert main([*base, "--from-config", str(path), "--no-progress"]) == code
        err = capsys.readouterr().err.strip()
        if code:
            assert '[model] flavor "70B" gives blocks 80, but llama3-8b has 32' in err
            assert len(err.splitlines()) == 1
    assert read_toml(_toml(""), world_size=8, source="x").model_says is None


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="needs torchtitan")
def test_torchtitan_registry_model_is_checked() -> None:
    """A configuration from torchtitan's registry states its model's blocks and hidden size, as
    torchtitan builds its model config (`config.model_spec.model`)."""
    setup = read_registry("llama3.llama3_8b", world_size=8)
    assert setup.model_says is not None
    assert setup.model_says.mismatch(profile()) is None  # Llama 3 8B
    big = parse_model("llama3-70b").to_profile(SEQ, act_bytes=2)
    said = setup.model_says.mismatch(big)
    assert said is not None and said.startswith("its model gives blocks 32, but")


def test_deepspeed_checkpoint_options_are_named() -> None:
    """deepspeed.checkpointing's host copies and TP partitioning change what a checkpoint
    holds on the GPU; paraplan prices neither, and says so."""
    from paraplan.export.deepspeed import read as read_deepspeed

    doc = (
        '{"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}, '
        '"bf16": {"enabled": true}, "activation_checkpointing": '
        '{"partition_activations": true, "cpu_checkpointing": true}}'
    )
    notes = "\n".join(read_deepspeed(doc, world_size=8, source="ds.json").notes)
    assert "cpu_checkpointing not priced" in notes
    assert "every one of the 2 tensor-parallel ranks" in notes
    plain = doc.replace('true, "cpu', 'false, "cpu').replace(
        '"cpu_checkpointing": true', '"cpu_checkpointing": false'
    )
    (note,) = read_deepspeed(plain, world_size=8, source="ds.json").notes
    assert note.startswith("activation_checkpointing read as every block recomputed")


_SCRIPT = r"""#!/bin/bash
# shaped like Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh
CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b_fp8"}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
TP_SIZE=2
NUM_LAYERS=32
DTYPE="fp8"
SEQ_LENGTH=4096
MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length ${SEQ_LENGTH}
    --swiglu
    --untie-embeddings-and-output-weights
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 64
    --bf16
)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-param-gather"
    )
fi
PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    # --pipeline-model-parallel-size 4
    --sequence-parallel  # with TP
)
if [[ -z "$DATA" ]]; then
    DATA_ARGS=("--mock-data" "--data-cache-path ${CHECKPOINT_PATH}/cache")
else
    DATA_ARGS=("--data-path $DATA" "--data-cache-path ${CHECKPOINT_PATH}/cache")
fi
torchrun --nproc_per_node 8 pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} \
    ${DTYPE_ARGS[@]} ${PARALLEL_ARGS[@]} ${DATA_ARGS[@]} --save "$CHECKPOINT_PATH"
"""


def test_megatron_launch_script_is_read() -> None:
    """A launch script as Megatron-LM's examples write them (variables, arrays, quoted
    "--flag value" words, a flag repeated in both branches of an if, comments after a switch)
    reads as its command line: before, its first repeated data flag stopped it."""
    from paraplan.export.megatron_read import parse_args

    args = parse_args(_SCRIPT)
    assert args["num-layers"] == "32" and args["seq-length"] == "4096"
    assert args["tensor-model-parallel-size"] == "2" and "pipeline-model-parallel-size" not in args
    assert args["fp8-format"] == "hybrid" and args["fp8-param-gather"] is None
    assert args["sequence-parallel"] is None and args["swiglu"] is None
    assert args["data-cache-path"] == "checkpoints/llama3_8b_fp8/cache"
    assert args["save"] == "checkpoints/llama3_8b_fp8"
    setup = read_config_text(_SCRIPT, world_size=8)
    assert (setup.strategy.tp, setup.strategy.dp, setup.strategy.sequence_parallel) == (2, 4, True)
    assert str(setup.precision) == "fp8" and setup.runtime_says is not None
    assert setup.runtime_says.fp8_all_gather is True
    assert setup.model_says is not None and setup.model_says.mismatch(profile()) is None
    # a flag paraplan reads, set otherwise in each branch: which one runs is not known
    two = _SCRIPT.replace('("--mock-data"', '("--micro-batch-size 2" "--mock-data"')
    with pytest.raises(ValueError, match="--micro-batch-size given twice, as '1' and '2'"):
        parse_args(two)
    unset = _SCRIPT.replace("NUM_LAYERS=32\n", "")
    with pytest.raises(ValueError, match="a shell variable the file does not set"):
        read_config_text(unset, world_size=8)


def read_config_text(text: str, *, world_size: int):
    from paraplan.export.megatron import read

    return read(text, world_size=world_size, source="train.sh")


def test_megatron_flags_in_a_string_variable() -> None:
    """Megatron-LM's older examples (examples/pretrain_gpt.sh) keep the flags in a string
    variable expanded unquoted: split as the shell splits it."""
    from paraplan.export.megatron_read import parse_args

    script = (
        'GPT_ARGS="\n    --num-layers 24 \\\n    --hidden-size 1024 \\\n    --fp16\n"\n'
        'PARALLEL="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"\n'
        "torchrun pretrain_gpt.py $GPT_ARGS $PARALLEL --data-path my_text_document\n"
    )
    args = parse_args(script)
    assert (args["num-layers"], args["hidden-size"], args["fp16"]) == ("24", "1024", None)
    assert args["tensor-model-parallel-size"] == "2" and args["pipeline-model-parallel-size"] == "2"
    assert args["data-path"] == "my_text_document"
    # a pipeline layout's own brackets are kept (Megatron-Core's repetition syntax)
    layout = parse_args('ARGS=(--pipeline-model-parallel-layout "(tt|)*2L")\ntorchrun ${ARGS[@]}')
    assert layout["pipeline-model-parallel-layout"] == "(tt|)*2L"


def test_torchtitan_cp_exchange_is_named() -> None:
    """torch's context parallel all-gathers K/V by default (`context_parallel_rotate_method`),
    priced as the ring: said."""
    text = _toml('mode = "full"\n').replace("degree = 8", "degree = 4\ncontext_parallel_degree = 2")
    notes = read_toml(text, world_size=8, source="x").notes
    assert any("context_parallel_rotate_method 'allgather' priced as the ring" in n for n in notes)


def test_megatron_transpose_cache_switch_is_named(tmp_path: Path) -> None:
    """`--disable-parameter-transpose-cache` under fp8: Transformer Engine then keeps no fp8
    weight copies (Megatron-Core passes no `is_first_microbatch`), which paraplan prices as
    kept: the note says so; without fp8 the switch changes nothing and is not named."""
    fp8 = "--fp8-format hybrid --disable-parameter-transpose-cache"
    setup = read_config(str(_megatron(tmp_path, fp8)), world_size=16)
    assert any("--disable-parameter-transpose-cache not priced" in n for n in setup.notes)
    plain = read_config(
        str(_megatron(tmp_path, "--disable-parameter-transpose-cache")), world_size=16
    )
    assert not any("transpose-cache" in n for n in plain.notes)
