"""Plan files: atomic save, and a strict load that hands on only a sound plan.

Loading checks the document against the schema `schema.py` generates (types, enums, bounds,
no unknown keys, finite numbers), builds the typed `Plan`, then checks what one field says
about another (mesh against degrees and world size, stages against pp, batch arithmetic).
Every problem is a ValueError naming the field by its JSON path, the rule and the fix.
"""

from __future__ import annotations

import functools
import os
import typing

from . import limits
from .config import Runtime
from .cost.hidden import HiddenCosts
from .cost.layout import chunk_stage
from .documents import Document, wrong_kind
from .frameworks import CONFIGURED_FIELDS, RUNTIMES, Framework
from .jsonio import dumps_finite, from_json, read_json, to_json, validate, write_atomic
from .plan import SCHEMA_VERSION, ChunkRange, Plan
from .schema import plan_schema
from .solvers.pipeline_replay import V_SHAPED
from .strategy import MeshAxis

_REGENERATE = "regenerate the plan with paraplan plan -o"
_REL_TOL = 1e-9
"""Relative difference allowed between a figure and the sum it is written as (rounding)."""


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON atomically (a reader never sees a half-written plan)."""
    write_atomic(path, dumps_finite(plan.to_dict(), "plan"))


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and strictly validate a plan JSON file (ValueError naming the path and problem)."""
    data = read_json(path, "plan", "write one with paraplan plan -o")
    try:
        other = wrong_kind(data, Document.PLAN, str(path))
        if other is not None:
            raise ValueError(other)
        return plan_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"plan file {str(path)!r}: {exc}") from None


_V4_PARALLELISM = {
    "powersgd_rank": None,
    "offload_params": False,
    "offload_activations": False,
    "async_pipeline": False,
}
"""What version 5 added to `parallelism`: a version-4 plan took none of these options."""
_V4_HIDDEN_COSTS = to_json(HiddenCosts())
"""`predicted.hidden_costs` of a version-4 plan: nothing hidden."""


_V6_RUNTIME = to_json(Runtime())
"""`train.runtime` of a version-6 plan: every plan was priced for paraplan's executor."""
_NEMO_RUNTIME = to_json(RUNTIMES[Framework.NEMO])
"""NeMo's runtime, which a version-7 plan recorded without `ep_comm_overlap`."""


_SINCE_V8 = ("ep_comm_overlap", "recompute_modules", "grad_reduce_overlap", "param_gather_overlap")
"""`train.runtime` keys a version-7 plan did not record."""
_SINCE_V10 = ("norm_keeps_input_only", "glu_keeps_input_only", "pp_comm_overlap")
"""`train.runtime` keys a version-9 plan did not record."""


@functools.cache
def _v9_presets() -> tuple[tuple[dict[str, typing.Any], dict[str, typing.Any]], ...]:
    """Each framework's runtime as a version-9 plan recorded it, less what a configuration sets
    itself, and what it keeps of the fields version 10 added."""
    out = []
    for known in RUNTIMES.values():
        doc = to_json(known)
        base = {k: v for k, v in doc.items() if k not in _SINCE_V10 + CONFIGURED_FIELDS}
        out.append((base, {k: doc[k] for k in _SINCE_V10}))
    return tuple(out)


def upgrade(data: typing.Any) -> typing.Any:
    """A version-4 to -14 plan document as the current version (`upgrade_v4` to
    `upgrade_v14`); anything else unchanged (the schema then says what is wrong)."""
    older = upgrade_v8(upgrade_v7(upgrade_v6(upgrade_v5(upgrade_v4(data)))))
    newer = upgrade_v13(upgrade_v12(upgrade_v11(upgrade_v10(upgrade_v9(older)))))
    return upgrade_v14(newer)


def upgrade_v14(data: typing.Any) -> typing.Any:
    """A version-14 plan document as version 15: no multi-token-prediction modules trained
    (`train.mtp_layers` 0, as every version-14 plan was priced); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 14:
        return data
    out = dict(data, schema_version=15)
    if isinstance(out.get("train"), dict):
        out["train"] = {"mtp_layers": 0, **out["train"]}
    return out


def upgrade_v13(data: typing.Any) -> typing.Any:
    """A version-13 plan document as version 14: its experts' tokens dispatched as one
    all-to-all of every copy (`train.runtime.ep_dispatch`, as every version-13 plan was priced)
    and its model's routing not group-limited (`ModelInfo.routing_groups` 1); anything else
    unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 13:
        return data
    out = dict(data, schema_version=14)
    train = out.get("train")
    if isinstance(train, dict) and isinstance(train.get("runtime"), dict):
        out["train"] = {**train, "runtime": {"ep_dispatch": "alltoall", **train["runtime"]}}
    if isinstance(out.get("model"), dict):
        out["model"] = {"routing_groups": 1, "routing_group_top_k": 1, **out["model"]}
    return out


_SINCE_V13 = {"dense_blocks": [], "dense_ffn": 0, "shared_expert_ffn": 0, "latent_attention": None}
"""`model` keys a version-12 plan did not record."""


def upgrade_v12(data: typing.Any) -> typing.Any:
    """A version-12 plan document as version 13: its MoE model's dense blocks, their MLP, the
    shared experts and latent attention not recorded (an export writes what it wrote before);
    anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 12:
        return data
    out = dict(data, schema_version=13)
    if isinstance(out.get("model"), dict):
        out["model"] = {**_SINCE_V13, **out["model"]}
    return out


def upgrade_v11(data: typing.Any) -> typing.Any:
    """A version-11 plan document as version 12: its blocks' attention windows not recorded
    (`ModelInfo.attention_windows` empty: an export writes what it wrote before); anything
    else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 11:
        return data
    out = dict(data, schema_version=12)
    if isinstance(out.get("model"), dict):
        out["model"] = {"attention_windows": [], **out["model"]}
    return out


_SINCE_V11 = {"ffn": 0, "gated_mlp": False, "top_k": 0, "tied_embeddings": False}
"""`model` keys a version-10 plan did not record (ffn 0: not recorded)."""


def upgrade_v10(data: typing.Any) -> typing.Any:
    """A version-10 plan document as version 11: its model's MLP and routing not recorded
    (`ModelInfo.ffn` 0; an export then writes the sizes it wrote before); anything else
    unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 10:
        return data
    out = dict(data, schema_version=11)
    if isinstance(out.get("model"), dict):
        out["model"] = {**_SINCE_V11, **out["model"]}
    return out


def upgrade_v9(data: typing.Any) -> typing.Any:
    """A version-9 plan document as version 10: a framework's runtime (Megatron's, NeMo's,
    torchtitan's compiled ones) keeps what its fused norms and SwiGLU keep
    (`norm_keeps_input_only`, `glu_keeps_input_only`: the runtime reads as that framework's, its
    activations now counted as those kernels save them), any other eager torch's (as every
    version-9 plan was priced); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 9:
        return data
    out = dict(data, schema_version=10)
    train = out.get("train")
    if isinstance(train, dict) and isinstance(train.get("runtime"), dict):
        runtime = train["runtime"]
        plain = {k: v for k, v in runtime.items() if k not in CONFIGURED_FIELDS}
        fill = next((kept for base, kept in _v9_presets() if base == plain), None)
        fill = fill or dict.fromkeys(_SINCE_V10, False)
        out["train"] = {**train, "runtime": {**fill, **runtime}}
    return out


def upgrade_v8(data: typing.Any) -> typing.Any:
    """A version-8 plan document as version 9: its selective recompute the attention core
    alone (`train.runtime.recompute_modules`, Megatron-Core's default) and its data-parallel
    traffic overlapped (`grad_reduce_overlap`, `param_gather_overlap`, as every version-8 plan
    was priced); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 8:
        return data
    out = dict(data, schema_version=9)
    train = out.get("train")
    if isinstance(train, dict) and isinstance(train.get("runtime"), dict):
        since = {"recompute_modules": ["core_attn"], **dict.fromkeys(_SINCE_V8[2:], True)}
        runtime = {**since, **train["runtime"]}
        out["train"] = {**train, "runtime": runtime}
    return out


def upgrade_v7(data: typing.Any) -> typing.Any:
    """A version-7 plan document as version 8: its experts split over TP as the dense layers
    (`parallelism.expert_tp` = tp, in the plan and its runners-up) and their all-to-alls not
    overlapped (`train.runtime.ep_comm_overlap`); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 7:
        return data

    def with_etp(par: typing.Any) -> typing.Any:
        if isinstance(par, dict) and "expert_tp" not in par:
            return {**par, "expert_tp": par.get("tp")}
        return par

    out = dict(data, schema_version=8)
    out["parallelism"] = with_etp(out.get("parallelism"))
    train = out.get("train")
    if isinstance(train, dict) and isinstance(train.get("runtime"), dict):
        runtime = train["runtime"]
        # NeMo's preset gained the all-to-all overlap with schema 8: a plan priced for it
        # stays NeMo's (its dense blocks price the same; a MoE plan's all-to-alls now hide)
        since = _SINCE_V8 + _SINCE_V10 + CONFIGURED_FIELDS  # (a configuration's own: any)
        plain = {k: v for k, v in runtime.items() if k not in since}
        nemo = plain == {k: v for k, v in _NEMO_RUNTIME.items() if k not in since}
        out["train"] = {**train, "runtime": {"ep_comm_overlap": nemo, **runtime}}
    if isinstance(out.get("runners_up"), list):
        out["runners_up"] = [
            {**r, "parallelism": with_etp(r.get("parallelism"))} if isinstance(r, dict) else r
            for r in out["runners_up"]
        ]
    return out


def upgrade_v6(data: typing.Any) -> typing.Any:
    """A version-6 plan document as version 7: heads as wide as hidden / heads (`head_dim` 0,
    unless the plan has it: plans written between the two changes) and priced for paraplan's
    executor (`train.runtime`); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 6:
        return data
    out = dict(data, schema_version=7)
    if isinstance(out.get("model"), dict):
        out["model"] = {"head_dim": 0, **out["model"]}
    if isinstance(out.get("train"), dict):
        out["train"] = {"runtime": dict(_V6_RUNTIME), **out["train"]}
    return out


def upgrade_v5(data: typing.Any) -> typing.Any:
    """A version-5 plan document as version 6: its model FLOP/s per GPU was not recorded
    (null); anything else unchanged."""
    if not isinstance(data, dict) or data.get("schema_version") != 5:
        return data
    out = dict(data, schema_version=6)
    if isinstance(out.get("predicted"), dict):
        out["predicted"] = {"model_flops_per_s_per_gpu": None, **out["predicted"]}
    return out


def upgrade_v4(data: typing.Any) -> typing.Any:
    """A version-4 plan document as version 5 (the options it could not take, off); anything
    else unchanged (the schema then says what is wrong)."""
    if not isinstance(data, dict) or data.get("schema_version") != 4:
        return data
    out = dict(data, schema_version=5)
    if isinstance(out.get("parallelism"), dict):
        out["parallelism"] = {**out["parallelism"], **_V4_PARALLELISM}
    if isinstance(out.get("predicted"), dict):
        out["predicted"] = {**out["predicted"], "hidden_costs": dict(_V4_HIDDEN_COSTS)}
    if isinstance(out.get("layers"), list):
        out["layers"] = [
            {**x, "offload_activations": False} if isinstance(x, dict) else x for x in out["layers"]
        ]
    if isinstance(out.get("runners_up"), list):
        out["runners_up"] = [
            {**r, "parallelism": {**r["parallelism"], **_V4_PARALLELISM}}
            if isinstance(r, dict) and isinstance(r.get("parallelism"), dict)
            else r
            for r in out["runners_up"]
        ]
    return out


def plan_from_dict(data: typing.Any) -> Plan:
    """Validate a parsed plan document and build the `Plan` (ValueError on any problem);
    version-4 to -11 documents are read as the current version (`upgrade`)."""
    data = upgrade(data)
    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ValueError(
            f"schema_version {data.get('schema_version')!r} is not supported (this paraplan "
            f"reads versions 4 to {SCHEMA_VERSION}); {_REGENERATE} of this version"
        )
    validate(data, plan_schema(), "plan", _REGENERATE)
    huge = limits.too_large(data)
    if huge is not None:
        _fail(
            huge[0],
            f"{limits.show_number(huge[1])} is larger than any real figure (the limit is "
            f"{limits.MAX_FIGURE:g})",
        )
    plan: Plan = from_json(Plan, data)
    check_plan(plan)
    return plan


def _fail(where: str, problem: str, fix: str = _REGENERATE) -> typing.NoReturn:
    raise ValueError(f"invalid plan at {where}: {problem}; {fix}")


def check_plan(plan: Plan) -> None:
    """The rules between fields that a schema cannot state; ValueError on the first broken."""
    _check_limits(plan)
    _check_cluster(plan)
    _check_mesh(plan)
    _check_stages(plan)
    _check_batch(plan)
    _check_memory(plan)


def _check_limits(plan: Plan) -> None:
    """The counts a plan carries within the bounds a planning request has (`planner.limits`)."""
    counts = (
        (limits.GPUS, plan.cluster.num_gpus, "cluster.num_gpus"),
        (limits.GPUS_PER_NODE, plan.cluster.gpus_per_node, "cluster.gpus_per_node"),
        (limits.GLOBAL_BATCH, plan.train.global_batch, "train.global_batch"),
        (limits.SEQ_LEN, plan.train.seq_len, "train.seq_len"),
        (limits.LAYERS, plan.model.num_blocks, "model.num_blocks"),
        (limits.HIDDEN, plan.model.hidden, "model.hidden"),
        (limits.HEADS, plan.model.heads, "model.heads"),
        (limits.VOCAB, plan.model.vocab, "model.vocab"),
        (limits.EXPERTS, plan.model.experts, "model.experts"),
    )
    for bound, value, where in counts:
        problem = bound.violation(value)
        if problem:
            _fail(where, f"{limits.show_number(value)} {problem}")
    if len(plan.layers) > limits.LAYERS.maximum + 2:  # blocks plus embedding and head
        _fail(
            "layers",
            f"{len(plan.layers):,} layers, over the limit of {limits.LAYERS.maximum} blocks",
        )
    chain = plan.model.num_blocks + plan.train.mtp_layers + 2
    if plan.train.mtp_layers and len(plan.layers) != chain:
        _fail(
            "layers",
            f"{len(plan.layers):,} layers for {plan.model.num_blocks} blocks and "
            f"{plan.train.mtp_layers} multi-token-prediction modules (the chain has "
            f"{chain}: embedding, blocks, modules, head)",
        )
    windows = plan.model.attention_windows
    if windows and (len(windows) != plan.model.num_blocks or not plan.model.windowed):
        _fail(
            "model.attention_windows",
            f"{len(windows)} windows for {plan.model.num_blocks} blocks (one per block, some "
            "above 0; none when no block has a window)",
        )


def _check_memory(plan: Plan) -> None:
    """The memory per GPU is its breakdown's total (each part then lies between 0 and it)."""
    pr = plan.predicted
    total = pr.memory_breakdown.total_bytes
    if pr.memory_per_gpu_bytes <= 0 or abs(pr.memory_per_gpu_bytes - total) > _REL_TOL * total:
        _fail(
            "predicted.memory_per_gpu_bytes",
            f"{pr.memory_per_gpu_bytes:g} bytes is not the sum of predicted.memory_breakdown "
            f"({total:g} bytes)",
        )


def _check_cluster(plan: Plan) -> None:
    c = plan.cluster
    if c.num_nodes * c.gpus_per_node != c.num_gpus:
        _fail(
            "cluster.num_gpus",
            f"{c.num_gpus} GPUs is not num_nodes x gpus_per_node = {c.num_nodes} x "
            f"{c.gpus_per_node} = {c.num_nodes * c.gpus_per_node}",
        )
    p = plan.parallelism
    world = p.dp * p.tp * p.pp * p.cp
    if world != c.num_gpus:
        _fail(
            "parallelism",
            f"dp x tp x pp x cp = {p.dp} x {p.tp} x {p.pp} x {p.cp} = {world} is not the "
            f"cluster's {c.num_gpus} GPUs (cluster.num_gpus); the degrees must use every GPU",
        )
    if p.expert_tp not in (1, p.tp):
        _fail("parallelism.expert_tp", f"expert_tp={p.expert_tp} is neither 1 nor tp={p.tp}")
    folded = p.expert_tp == 1 and p.tp > 1 and p.ep > 1
    if folded and (p.ep % p.tp or p.dp % (p.ep // p.tp)):
        _fail(
            "parallelism.ep",
            f"ep={p.ep} with expert_tp=1 (experts folded over TP) is not a multiple of tp="
            f"{p.tp} whose quotient divides dp={p.dp}",
        )
    if not folded and p.dp % p.ep:
        _fail("parallelism.ep", f"ep={p.ep} does not divide dp={p.dp} (experts live inside dp)")
    if p.dp % p.dp_shard or (p.dp_shard != p.dp and (p.zero_stage != 3 or p.dp_shard < 2)):
        _fail(
            "parallelism.dp_shard",
            f"dp_shard={p.dp_shard} with dp={p.dp}, zero_stage={p.zero_stage}: dp_shard is dp, "
            f"or (HSDP, zero_stage 3) a divisor of dp of at least 2",
        )


def _check_mesh(plan: Plan) -> None:
    m, p = plan.mesh, plan.parallelism
    if len(m.shape) != len(m.axis_order):
        _fail(
            "mesh.shape",
            f"{len(m.shape)} sizes {list(m.shape)} for {len(m.axis_order)} axes "
            f"{[str(a) for a in m.axis_order]} in mesh.axis_order: one size per axis",
        )
    if set(m.axis_order) != set(MeshAxis):
        _fail(
            "mesh.axis_order",
            f"axes {[str(a) for a in m.axis_order]}: the mesh names each of "
            f"{[str(a) for a in MeshAxis]} once",
        )
    degrees = {MeshAxis.PP: p.pp, MeshAxis.DP: p.dp, MeshAxis.CP: p.cp, MeshAxis.TP: p.tp}
    # each size is its axis's degree, so the mesh holds dp*tp*pp*cp = num_gpus devices
    for i, (axis, size) in enumerate(zip(m.axis_order, m.shape, strict=True)):
        if size != degrees[axis]:
            _fail(
                f"mesh.shape.{i}",
                f"size {size} of mesh axis {str(axis)!r} is not the plan's degree "
                f"parallelism.{axis}={degrees[axis]}",
            )


def _check_stages(plan: Plan) -> None:
    """pp stages in order, virtual_stages chunks each, chunk c on stage c % pp (in a V for
    ZB-V and DualPipeV: `cost.layout.chunk_stage`), and the chunks' layer ranges covering the
    layer list once, in chunk order."""
    p = plan.parallelism
    v_shaped = plan.schedule in V_SHAPED
    if len(plan.stages) != p.pp:
        _fail("stages", f"{len(plan.stages)} stages for parallelism.pp={p.pp}: one per stage")
    by_chunk: dict[int, tuple[str, ChunkRange]] = {}
    for i, st in enumerate(plan.stages):
        if st.stage != i:
            _fail(f"stages.{i}.stage", f"stage {st.stage} listed in position {i}: list in order")
        if len(st.chunks) != p.virtual_stages:
            _fail(
                f"stages.{i}.chunks",
                f"{len(st.chunks)} chunks for parallelism.virtual_stages={p.virtual_stages}",
            )
        for j, ch in enumerate(st.chunks):
            where = f"stages.{i}.chunks.{j}"
            if chunk_stage(ch.chunk, p.pp, v_shaped) != i or ch.chunk in by_chunk:
                rule = "in a V (c, or 2 pp - 1 - c past pp)" if v_shaped else "c % pp"
                _fail(
                    f"{where}.chunk",
                    f"chunk {ch.chunk} on stage {i}: each chunk c is listed once, on stage {rule}",
                )
            by_chunk[ch.chunk] = (where, ch)
    start = 0
    for k, c in enumerate(sorted(by_chunk)):
        where, ch = by_chunk[c]
        if c != k:
            _fail(f"{where}.chunk", f"chunk {c}: number the chunks 0..{len(by_chunk) - 1}")
        if ch.first_layer != start or ch.last_layer < ch.first_layer - 1:
            _fail(
                f"{where}.first_layer",
                f"chunk {c} holds layers {ch.first_layer}..{ch.last_layer}, but the chunks "
                f"cover the layers once, in chunk order: it starts at layer {start}",
            )
        start = ch.last_layer + 1
    if start != len(plan.layers):
        _fail(
            "stages",
            f"the chunks end at layer {start - 1}, but the last of the {len(plan.layers)} "
            f"layers is {len(plan.layers) - 1}",
        )
    for i, layer in enumerate(plan.layers):
        if layer.index != i:
            _fail(f"layers.{i}.index", f"index {layer.index} in position {i}: list in order")


def _check_batch(plan: Plan) -> None:
    dp, mbs, nmb = plan.parallelism.dp, plan.micro_batch_size, plan.num_microbatches
    if mbs * nmb * dp != plan.train.global_batch:
        _fail(
            "train.global_batch",
            f"{plan.train.global_batch} sequences is not micro_batch_size x num_microbatches x "
            f"dp = {mbs} x {nmb} x {dp} = {mbs * nmb * dp}",
        )
