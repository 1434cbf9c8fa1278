"""Bad trainer configurations (`plan --from-config`): a placeholder, a malformed value or a
count that would divide by zero is refused with exit 2 and one line naming the key and what to
write, before any search (before: a bare Python error, a traceback, or a value read as another)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.cli import main


def _refused(path: Path, capsys: pytest.CaptureFixture, *extra: str) -> str:
    argv = ["plan", "--from-config", str(path), "--model", "llama3-8b", *extra]
    assert main([*argv, "--model-source", "spec", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (  # the Hugging Face Trainer's DeepSpeed configs leave the batch to it
            '{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}',
            'train_micro_batch_size_per_gpu is "auto", which the Hugging Face Trainer fills',
        ),
        (
            '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": "auto"}}',
            'bf16.enabled is "auto"',
        ),
        ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": 3}', "is not an object"),
        (
            '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}}',
            "must be 0, 1, 2 or 3",
        ),
        ('{"train_micro_batch_size_per_gpu": 1.5}', "must be a whole number >= 1"),
    ],
)
def test_deepspeed_values_are_checked(
    doc: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A DeepSpeed config's placeholders and malformed values: exit 2 and one line naming the
    key and what to write (before: a bare Python error, or "auto" read as enabled)."""
    path = tmp_path / "ds.json"
    path.write_text(doc)
    assert said in _refused(path, capsys, "--cluster", "8xh100", "--seq-len", "4096")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('"x"', 'tensor_parallel_degree = "x" must be a whole number >= 1'),
        ("2.5", "tensor_parallel_degree = 2.5 must be"),  # was read as 2
        ("true", "tensor_parallel_degree = true must be"),  # was read as 1
        ("0", "tensor_parallel_degree = 0 must be"),  # was a ZeroDivisionError traceback
    ],
)
def test_torchtitan_degrees_are_checked(
    value: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        f"[parallelism]\ntensor_parallel_degree = {value}\n[training]\nseq_len = 4096\n"
    )
    assert said in _refused(path, capsys, "--cluster", "8xh100")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ("--micro-batch-size 0", "--micro-batch-size 0 must be at least 1"),  # was a traceback
        ("--num-virtual-stages-per-pipeline-rank 0", "must be at least 1"),  # "min() arg ..."
        ("--num-layers 32 --num-layers-per-virtual-pipeline-stage 0", "must be at least 1"),
        ("--global-batch-size 0", "--global-batch-size 0 must be at least 1"),
    ],
)
def test_megatron_counts_are_checked(
    flags: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "train.sh"
    base = (
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --seq-length 4096 --bf16"
    )
    batch = "" if "batch-size" in flags else " --micro-batch-size 1 --global-batch-size 64"
    path.write_text(f"{base}{batch} {flags}\n")
    err = _refused(path, capsys, "--cluster", "16xh100")
    assert said in err and err.startswith(f"paraplan: error: {path}:")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('[compile]\nenable = "yes"', 'enable = "yes" must be true or false'),
        (  # "no" read as true: sequence parallelism priced on
            '[parallelism]\ntensor_parallel_degree = 2\nenable_sequence_parallel = "no"',
            'enable_sequence_parallel = "no" must be true or false',
        ),
        ("[model]\nconverters = 5", "converters = 5 must be a list of names"),  # a traceback
        (
            "[parallelism]\npipeline_parallel_degree = 2\nmodule_fqns_per_model_part = 5",
            "must be a list of lists of module names",
        ),
        ("[parallelism]\nfsdp_reshard_after_forward = 5", "use one of default, always, never"),
        ('[model]\nname = "x"\n[activation_checkpoint]\nmode = []', "activation_checkpoint mode"),
        (  # "bf16" read as fp32 training
            '[model]\nname = "x"\n[job]\nx = 1\n[training]\nmixed_precision_param = "bf16"\n'
            "seq_len = 4096",
            'mixed_precision_param = "bf16": use one of float32, bfloat16, float16',
        ),
    ],
)
def test_torchtitan_values_are_checked(
    body: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "job.toml"
    text = body if "[training]" in body else f"{body}\n[training]\nseq_len = 4096\n"
    path.write_text(text)
    err = _refused(path, capsys, "--cluster", "8xh100")
    assert said in err and err.startswith(f"paraplan: error: {path}:")


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--recompute-granularity full --recompute-method blocks", "--recompute-method 'blocks'"),
        ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grad", "optim_grads_params"),
        ("--fp8-format e5m2", "--fp8-format 'e5m2': Megatron takes one of e4m3, hybrid"),
        ("--moe-token-dispatcher-type all2all", "allgather, alltoall, flex"),
    ],
)
def test_megatron_values_are_megatrons(
    flag: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A misspelt value Megatron-LM refuses (argparse `choices`, TransformerConfig literals)
    was read as a default (ZeRO-0 for an unknown sharding strategy, full recompute for an
    unknown method)."""
    path = tmp_path / "train.sh"
    path.write_text(f"--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 {flag}")
    assert said in _refused(path, capsys, "--cluster", "16xh100")
