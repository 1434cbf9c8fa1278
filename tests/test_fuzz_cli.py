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
import copy
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
from paraplan.planner.model_spec import PRESETS, parse_model
from paraplan.planner.plan_io import load_plan
from paraplan.planner.profile_io import profile_to_dict

EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "1100"))
"""Generated cases over all the fuzz tests (split by `SHARE`)."""
RANDOM = os.environ.get("PARAPLAN_FUZZ_RANDOM", "") == "1"
"""PARAPLAN_FUZZ_RANDOM=1: new random cases on each run (a local search), not CI's fixed set."""
CASE_LIMIT_S = 10.0
"""Most CPU time a single case may use (CPU, not wall-clock, time: a CI machine shared with
other jobs must not fail the test; work that grows with a number shows in either)."""
HARD_STOP_S = 60
"""Wall-clock seconds after which a case is stopped as hung (e.g. blocked opening a FIFO)."""
SHARE = {"argv": 0.30, "plan": 0.30, "profile": 0.15, "cluster": 0.13, "spec": 0.10, "hf": 0.02}
"""How the examples are split between the tests (Hugging Face configs are traced: slowest)."""
TINY = "gpt:layers=2,hidden=64,heads=2,vocab=128,seq=64"
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


# ---- values ------------------------------------------------------------------------------------
HOSTILE_TEXT = [
    "0",
    "-1",
    "1.5",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "1e12",
    "1e30",
    "1e308",
    "1e999",
    "1" + "0" * 5000,
    "",
    " ",
    "abc",
    "0x10",
    "16M",
    "4G",
    "1_024",
    "1,024",
    "2**10",
    "\x00",
    "\u2603",
    "-0",
    "+3",
    "1e-3",
    "9" * 40,
]
"""Text a user may type where a number is expected."""
HOSTILE_VALUES: list[Any] = [
    0,
    -1,
    1,
    2,
    3,
    7,
    0.5,
    -0.5,
    1e-300,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    -float("inf"),
    10**30,
    2**63,
    -(2**63),
    10**400,
    True,
    False,
    None,
    "",
    "x",
    "\u2603",
    "1",
    [],
    {},
    [1, 2],
    {"k": 1},
    "gelu",
]
"""Values a mutated file may hold in place of any other."""


class _Pick:
    """Draws one value for a field: a sane one, or, in a hostile case, now and then a hostile
    one. Six cases in ten are sane throughout, so most reach the planner and the printer."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.hostile = draw(st.integers(0, 9)) < 4

    def __call__(self, sane: list[str], odd: list[str] = HOSTILE_TEXT) -> str:
        if self.hostile and self.draw(st.integers(0, 3)) == 0:
            return self.draw(st.sampled_from(odd))
        return self.draw(st.sampled_from(sane))

    def maybe(self, one_in: int) -> bool:
        """True once in `one_in` draws."""
        return self.draw(st.integers(0, one_in - 1)) == 0


def _spec_text(pick: _Pick) -> str:
    family = pick(["gpt", "llama", "moe"], ["bert", "", "GPT"])
    fields = {
        "layers": pick(["1", "2", "3", "4"]),
        "hidden": pick(["32", "64", "128"]),
        "heads": pick(["1", "2", "4"]),
        "vocab": pick(["64", "128", "500"]),
        "seq": pick(["16", "32", "64", "128"]),
    }
    if family == "moe" or pick.maybe(8):
        fields |= {"experts": pick(["2", "4", "8"]), "top_k": pick(["1", "2"])}
    optional = {
        "kv_heads": ["1", "2"],
        "ffn": ["128", "256"],
        "ffn_kind": ["gelu", "swiglu"],
        "attention": ["flash", "math"],
        "tied_embeddings": ["true", "no"],
    }
    for key, values in optional.items():
        if pick.maybe(5):
            fields[key] = pick(values, ["0", "x", "-1", "1e12"])
    if pick.hostile and pick.maybe(4):
        fields.pop(pick.draw(st.sampled_from(sorted(fields))))
    body = ",".join(f"{k}={v}" for k, v in fields.items())
    if pick.hostile and pick.maybe(4):
        body += pick.draw(st.sampled_from([",", ",,=", ",layers", "=3", ",x=y=z", ",nonsense=1"]))
    return f"{family}:{body}"


_FIX_SANE = [
    "dp=2",
    "tp=2",
    "pp=2",
    "mbs=1",
    "zero=3",
    "zero=1",
    "schedule=1f1b",
    "schedule=gpipe",
    "recompute=full",
    "recompute=selective",
    "sp=true",
    "offload=1",
    "vpp=2",
    "ep=2",
    "cp=2",
]
_FIX_ODD = ["tp=1e12", "pp=0", "pp=1000", "zero=7", "foo=1", "tp", "=", "dp=-1", "schedule=x"]


@st.composite
def command_lines(draw: st.DrawFn, out_dir: Path) -> list[str]:
    """`paraplan plan` (mostly) or `checkpoint` arguments: sane, or with hostile values."""
    pick = _Pick(draw)
    if pick.maybe(8):
        budget = pick(["1M", "64K", "256K", "1G", "5 GiB"], ["0", "1e300", "-1", "x", "inf"])
        argv = ["checkpoint", "--model", _spec_text(pick), "--budget", budget]
        if pick.maybe(2):
            argv += ["--micro-batch", pick(["1", "2", "4"])]
        return argv
    model = (
        _spec_text(pick)
        if not pick.maybe(6)
        else pick(
            ["gpt2", "llama3-8b", "mixtral-8x7b"], ["x" * 300, "nope", "", "gpt:", ":", "\x00"]
        )
    )
    argv = ["plan", "--no-progress", "--model", model, "--model-source", "spec"]
    if not pick.maybe(6):
        gpus = pick(["1", "2", "4", "8", "16"])
        argv += ["--cluster", f"{gpus}x{pick(['cpu', 'h100', 'a100-80gb', 'l4'], ['nope', ''])}"]
    else:
        argv += ["--gpus", pick(["8", "16", "32"]), "--gpu", pick(["h100", "cpu"], ["x"])]
        if pick.maybe(2):
            argv += ["--gpus-per-node", pick(["2", "4", "8"])]
    if not pick.maybe(5):
        argv += ["--global-batch", pick(["1", "2", "4", "8", "16", "32", "64"])]
    else:
        argv += ["--global-batch-tokens", pick(["1024", "4K", "8192"])]
    if pick.maybe(4):
        argv += ["--seq-len", pick(["16", "32", "64"])]
    if pick.maybe(3):
        tokens = [pick(_FIX_SANE, _FIX_ODD) for _ in range(draw(st.integers(0, 3)))]
        argv += ["--fix", ",".join(tokens)]
    if pick.maybe(5):
        argv += ["--top", pick(["0", "1", "5"])]
    if pick.maybe(5):
        argv += ["--memory-headroom", pick(["0.1", "0", "0.5"], ["1", "nan", "-1", "x"])]
    if pick.maybe(5):
        argv += ["--precision", pick(["bf16", "fp32", "fp16"], ["fp8"])]
    if pick.maybe(5):
        argv += ["--optimizer", pick(["adamw", "sgd", "adafactor", "adam8bit"], ["lion"])]
    if pick.maybe(4):
        name = pick(["plan.json"], ["", "missing/p.json", ".", "fifo", "/dev/null", "b" * 300])
        argv += ["-o", str(out_dir / name) if name and name != "/dev/null" else name]
    if pick.maybe(6):
        argv.append("--json")
    return argv


@st.composite
def mutations(draw: st.DrawFn, doc: Any) -> Any:
    """`doc` edited: half the time mildly (numbers scaled, flags flipped: often still valid),
    else with one to three hostile edits (a value replaced by a hostile one, a key removed or
    added, a list item repeated)."""
    doc = copy.deepcopy(doc)
    if draw(st.booleans()):
        for _ in range(draw(st.integers(0, 3))):
            node, key = _location(draw, doc)
            if node is not None and isinstance(node[key], bool):
                node[key] = not node[key]
            elif node is not None and isinstance(node[key], float):
                node[key] *= draw(st.sampled_from([0.5, 0.999, 1.001, 3.0, 1e3, 1e-3]))
        return doc
    for _ in range(draw(st.integers(1, 3))):
        node, key = _location(draw, doc)
        if node is None:
            return draw(st.sampled_from(HOSTILE_VALUES))  # the whole document replaced
        value = node[key]
        op = draw(
            st.sampled_from(["nudge", "nudge", "hostile", "hostile", "remove", "add", "repeat"])
        )
        if op == "nudge" and isinstance(value, int | float) and not isinstance(value, bool):
            node[key] = value * draw(st.sampled_from([0, -1, 2, 3]))  # ints stay ints
        elif op == "remove":
            del node[key]
        elif op == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(["extra", "", "layers", "name"]))] = 1
        elif op == "repeat" and isinstance(node, list):
            node.insert(key, copy.deepcopy(value))
        else:
            node[key] = copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES)))
    return doc


def _location(draw: st.DrawFn, doc: Any) -> tuple[Any, Any]:
    """A (container, key) somewhere in `doc`, each level more likely to stop than go on."""
    if not isinstance(doc, dict | list) or not doc or draw(st.integers(0, 60)) == 0:
        return None, None
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, dict | list) and child and draw(st.integers(0, 2)):
            node = child
            continue
        return node, key


@st.composite
def file_texts(draw: st.DrawFn, doc: Any, *, yaml: bool = False) -> bytes:
    """A mutated document as bytes, sometimes damaged as text: cut short, a stray byte, deeply
    nested, a byte-order mark, NaN written as JSON's missing token."""
    data = draw(mutations(doc))
    text = json.dumps(data)  # NaN and Infinity as Python writes them
    if yaml and draw(st.booleans()):
        import yaml as pyyaml

        text = pyyaml.safe_dump(json.loads(text))
    raw = text.encode()
    damage = draw(st.integers(0, 19))
    if damage == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == 1:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"{", b"]", b"\xe9"])) + raw[at:]
    elif damage == 2:
        depth = draw(st.sampled_from([10, 70, 5000]))
        raw = b"[" * depth + raw + b"]" * depth
    elif damage == 3:
        raw = b"\xef\xbb\xbf" + raw
    return raw


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
