"""The generators of the CLI fuzz suite (tests/test_fuzz_cli.py): hostile values, command
lines, and mutated documents and file texts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TINY = "gpt:layers=2,hidden=64,heads=2,vocab=128,seq=64"
"""A model small enough that planning it takes milliseconds."""


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
        argv += ["--precision", pick(["bf16", "fp32", "fp16", "fp8"], ["fp4"])]
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
