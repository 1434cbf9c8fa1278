"""Property-based fuzzing of the command line (issue 14), with Hypothesis: generated command
lines and mutated plan, profile, cluster, model and Hugging Face config files, fed in-process to
the CLI's `main`. Every case must end in exit status 0 or 2, with no traceback, within
`CASE_LIMIT_S` seconds of CPU time; a success prints no NaN or infinity, and a plan it writes
loads back.

The inputs are small (tiny models, a few GPUs) so that a case takes milliseconds, with hostile
values mixed in (zero, negative, NaN, 1e308, 5,000-digit numbers, deep nesting, wrong types,
truncated text) that must be refused fast. The runs are deterministic (`derandomize`): CI runs
`EXAMPLES` cases in all (over 1,000, about a minute); set PARAPLAN_FUZZ_EXAMPLES to a larger
total (e.g. 20000) to search longer, and PARAPLAN_FUZZ_RANDOM=1 for new cases on each run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paraplan
from paraplan.cli import main
from paraplan.planner.model_parse import parse_model
from paraplan.planner.model_spec import PRESETS
from paraplan.planner.plan_io import load_plan
from paraplan.planner.profile_io import profile_to_dict
from tests.fuzz_inputs import TINY, command_lines, file_texts, mutations

EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "1100"))
"""Generated cases over all the fuzz tests (split by `SHARE`)."""
RANDOM = os.environ.get("PARAPLAN_FUZZ_RANDOM", "") == "1"
"""PARAPLAN_FUZZ_RANDOM=1: new random cases on each run (a local search), not CI's fixed set."""
CASE_LIMIT_S = 10.0
"""Most CPU time a single case may use (CPU, not wall-clock, time: a CI machine shared with
other jobs must not fail the test; work that grows with a number shows in either)."""
HARD_STOP_S = 60
"""Wall-clock seconds after which a case is stopped as hung (e.g. blocked opening a FIFO)."""
SHARE = {
    "argv": 0.28,
    "plan": 0.27,
    "profile": 0.15,
    "cluster": 0.13,
    "spec": 0.10,
    "config": 0.08,
    "hf": 0.02,
}
"""How the examples are split between the tests (Hugging Face configs are traced: slowest)."""
NON_FINITE = re.compile(r"(?<![\w.])-?(nan|inf)(?![\w])", re.IGNORECASE)


def _settings(kind: str) -> settings:
    return settings(
        max_examples=max(1, round(EXAMPLES * SHARE[kind])),
        derandomize=not RANDOM,  # a fixed seed: CI runs the same cases every time
        database=None,
        deadline=None,  # timed by `_run` instead (the first case imports torch)
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )


class _Hang(Exception):
    """A case ran past the hard stop (a hang, not a slow case)."""


@contextlib.contextmanager
def _hard_stop(seconds: int) -> Iterator[None]:
    def stop(*_: object) -> None:
        raise _Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run(argv: list[str]) -> tuple[int, str, str]:
    """`paraplan argv` in-process: (status, stdout, stderr), checked against the invariants."""
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with _hard_stop(HARD_STOP_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: bad arguments (2) or --help (0)
            code = exc.code if isinstance(exc.code, int) else 1
    seconds = time.process_time() - start
    stdout, stderr = out.getvalue(), err.getvalue()
    shown = f"argv={argv!r}\nstderr={stderr[-2000:]}"
    assert code in (0, 2), shown
    assert "Traceback" not in stderr, shown
    assert seconds < CASE_LIMIT_S, f"{seconds:.1f} s: {shown}"
    if code == 2:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        assert last.startswith("paraplan"), shown  # one clear message, last
    else:
        assert not NON_FINITE.search(stdout), f"non-finite figure printed: {shown}\n{stdout}"
    return code, stdout, stderr


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the cases' files, with a FIFO to write to."""
    folder = tmp_path_factory.mktemp("fuzz")
    os.mkfifo(folder / "fifo")
    return folder


@pytest.fixture(scope="module")
def plan_docs() -> list[dict[str, Any]]:
    """Two saved plans: data parallel only, and dp x pp x tp with interleaved chunks."""
    return [
        paraplan.plan(TINY, "2xcpu", global_batch=4, top_k=2).plan.to_dict(),
        paraplan.plan(
            "gpt:layers=4,hidden=64,heads=2,vocab=128,seq=64",
            "8xcpu",
            global_batch=8,
            fix="pp=2,tp=2,vpp=2",
            top_k=2,
        ).plan.to_dict(),
    ]


_counter = iter(range(10**9))


def _write(folder: Path, suffix: str, raw: bytes) -> Path:
    path = folder / f"case{next(_counter)}{suffix}"
    path.write_bytes(raw)
    return path


def _check_written(argv: list[str], code: int) -> None:
    """A successful `plan -o FILE` left a plan that loads back."""
    if code == 0 and argv[0] == "plan" and "-o" in argv:
        target = argv[argv.index("-o") + 1]
        if Path(target).is_file() and os.path.getsize(target):
            load_plan(target)
            os.unlink(target)


# ---- the tests ----------------------------------------------------------------------------
def test_command_lines(work: Path) -> None:
    @_settings("argv")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        argv = data.draw(command_lines(work))
        code, _, _ = _run(argv)
        _check_written(argv, code)

    case()


def test_plan_files(work: Path, plan_docs: list[dict[str, Any]]) -> None:
    @_settings("plan")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        doc = data.draw(st.sampled_from(plan_docs))
        path = _write(work, ".json", data.draw(file_texts(doc)))
        command = data.draw(st.sampled_from(["show", "explain", "export"]))
        if command == "export":
            trainer = data.draw(st.sampled_from(["torchtitan", "megatron", "deepspeed"]))
            _run(["export", str(path), "--to", trainer])
        else:
            _run([command, str(path)])

    case()


def test_profile_files(work: Path) -> None:
    moe = parse_model("moe:layers=2,hidden=64,heads=2,vocab=128,seq=64,experts=4,top_k=2")
    docs = [profile_to_dict(PRESETS["gpt2"].to_profile(64)), profile_to_dict(moe.to_profile())]

    @_settings("profile")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        path = _write(work, ".json", data.draw(file_texts(data.draw(st.sampled_from(docs)))))
        gb = data.draw(st.sampled_from(["4", "8", "16"]))
        _run(["plan", "--profile", str(path), "--cluster", "4xcpu", "--global-batch", gb])

    case()


def test_cluster_files(work: Path) -> None:
    doc = {
        "name": "c",
        "accelerator": "cpu",
        "nodes": 2,
        "gpus_per_node": 2,
        "calibration": {"matmul_efficiency": 0.5, "peak_flops": {"bf16": 1.0e12}},
    }

    @_settings("cluster")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        yaml = data.draw(st.booleans())
        raw = data.draw(file_texts(doc, yaml=yaml))
        path = _write(work, ".yaml" if yaml else ".json", raw)
        _run(["plan", "--model", TINY, "--cluster", str(path), "--global-batch", "4"])

    case()


def test_model_spec_files(work: Path) -> None:
    doc = {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq": 64, "ffn_kind": "gelu"}

    @_settings("spec")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        path = _write(work, ".json", data.draw(file_texts(doc)))
        _run(["plan", "--model", str(path), "--cluster", "2xcpu", "--global-batch", "4"])

    case()


def _toml(doc: Any) -> str:
    """A mutated configuration as TOML text (tables of keys; what TOML cannot say, such as a
    null or a NaN written as JSON writes it, is written anyway: the reader must refuse it)."""
    if not isinstance(doc, dict):
        return json.dumps(doc)
    lines = []
    for name, table in doc.items():
        if not isinstance(table, dict):
            lines.append(f"{name} = {json.dumps(table)}")
            continue
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines)


def _megatron(doc: Any) -> str:
    """A mutated configuration as Megatron arguments (a switch where the value is None)."""
    if not isinstance(doc, dict):
        return str(doc)
    return " ".join(f"--{k}" if v is None else f"--{k} {v}" for k, v in doc.items())


_CONFIGS: dict[str, tuple[str, Any]] = {
    "torchtitan": (
        ".toml",
        {
            "parallelism": {
                "data_parallel_shard_degree": -1,
                "tensor_parallel_degree": 2,
                "enable_sequence_parallel": True,
                "pipeline_parallel_degree": 2,
                "pipeline_parallel_schedule": "1F1B",
                "module_fqns_per_model_part": [["tok_embeddings", "layers.0"], ["layers.1"]],
                "fsdp_reshard_after_forward": "default",
            },
            "training": {
                "local_batch_size": 2,
                "seq_len": 64,
                "global_batch_size": 8,
                "mixed_precision_param": "bfloat16",
                "enable_cpu_offload": False,
            },
            "activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"},
            "model": {"name": "llama3", "flavor": "tiny", "converters": []},
            "compile": {"enable": False},
        },
    ),
    "megatron": (
        ".sh",
        {
            "tensor-model-parallel-size": 2,
            "pipeline-model-parallel-size": 2,
            "num-layers": 2,
            "seq-length": 64,
            "micro-batch-size": 1,
            "global-batch-size": 8,
            "bf16": None,
            "recompute-granularity": "full",
            "recompute-method": "block",
            "recompute-num-layers": 1,
            "num-virtual-stages-per-pipeline-rank": 1,
            "decoder-last-pipeline-num-layers": 1,
            "context-parallel-size": 1,
            "use-distributed-optimizer": None,
            "overlap-grad-reduce": None,
            "recompute-modules": "core_attn",
            "hidden-size": 64,
            "num-attention-heads": 2,
            "cpu-offloading-num-layers": 0,
        },
    ),
    "deepspeed": (
        ".json",
        {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 2,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}},
            "bf16": {"enabled": True},
            "activation_checkpointing": {"partition_activations": False},
        },
    ),
}


def test_trainer_configs(work: Path) -> None:
    """`plan --from-config` on mutated torchtitan, Megatron and DeepSpeed configurations (each
    base one plans as it is: `test_fuzz_bases_plan`)."""

    @_settings("config")
    @given(st.data())
    def case(data: st.DataObject) -> None:
        trainer = data.draw(st.sampled_from(sorted(_CONFIGS)))
        suffix, doc = _CONFIGS[trainer]
        if trainer == "deepspeed":
            raw = data.draw(file_texts(doc))
        else:
            mutated = data.draw(mutations(doc))
            raw = (_toml(mutated) if trainer == "torchtitan" else _megatron(mutated)).encode()
        path = _write(work, suffix, raw)
        argv = ["plan", "--from-config", str(path), "--model", TINY, "--cluster", "8xcpu"]
        _run([*argv, *(["--seq-len", "64"] if trainer == "deepspeed" else [])])

    case()


@pytest.mark.parametrize("trainer", sorted(_CONFIGS))
def test_fuzz_bases_plan(trainer: str, work: Path) -> None:
    """The base configurations the fuzz mutates are read and planned (so that mild mutations
    reach the search, not only the readers' refusals)."""
    suffix, doc = _CONFIGS[trainer]
    text = {"torchtitan": _toml, "megatron": _megatron}.get(trainer, json.dumps)(doc)
    path = _write(work, suffix, text.encode())
    argv = ["plan", "--from-config", str(path), "--model", TINY, "--cluster", "8xcpu"]
    code, out, _ = _run([*argv, *(["--seq-len", "64"] if trainer == "deepspeed" else [])])
    assert code == 0 and "yours" in out


def test_hugging_face_configs(work: Path) -> None:
    """Traced on the meta device (the slowest cases: few of them). The first trace imports
    torch and transformers (seconds): done before the timed cases."""
    warm = _write(work, ".json", json.dumps({"model_type": "gpt2", "n_layer": 1}).encode())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["plan", "--model", str(warm), "--cluster", "2xcpu", "--global-batch", "2"])
    doc = {
        "model_type": "gpt2",
        "n_layer": 1,
        "n_embd": 32,
        "n_head": 2,
        "vocab_size": 64,
        "n_positions": 32,
    }
    keys = [
        *sorted(doc),
        "n_inner",
        "activation_function",
        "layer_norm_epsilon",
        "tie_word_embeddings",
    ]
    values = st.sampled_from([1, 2, 4, 32, 64, 0, -1, 10**12, "abc", "gelu", 1.5, None, 10**400])

    @_settings("hf")
    @given(st.sampled_from(keys), values, st.sampled_from(["plan", "profile"]))
    def case(key: str, value: Any, command: str) -> None:
        path = _write(work, ".json", json.dumps({**doc, key: value}).encode())
        if command == "plan":
            _run(["plan", "--model", str(path), "--cluster", "2xcpu", "--global-batch", "2"])
        else:
            _run(["profile", "--model", str(path), "--seq-len", "16"])

    case()


def test_the_fuzz_runs_enough_cases() -> None:
    """The acceptance: at least 1,000 generated cases in CI."""
    assert sum(max(1, round(EXAMPLES * s)) for s in SHARE.values()) >= 1000 or (
        "PARAPLAN_FUZZ_EXAMPLES" in os.environ
    )
