"""Plans in words: the table `paraplan plan` prints and what `paraplan explain` says."""

from __future__ import annotations

from .config import EpDispatch, Precision, RecomputeModule
from .explain_options import option_lines, option_rows
from .frameworks import runtime_note
from .model import LayerKind, ModelProfile, windows_text
from .plan import Plan, RunnerUp
from .strategy import Recompute
from .units import GIB, MIB, UNIT_NOTE, WHOLE_SECONDS_FROM_S, count, figure, gib, seconds

MEMORY_BOUND_SHARE = 0.9
"""A plan using more than this share of usable memory is called memory-bound."""


TERA = 1e12
"""FLOPs per TFLOP."""


def _gb(x: float) -> str:
    return gib(x)


def model_flops_per_s_per_gpu(plan: Plan, step_time_s: float | None = None) -> float | None:
    """Model FLOPs per second per GPU of the plan, or of another strategy for the same model,
    cluster and batch that takes `step_time_s` (a runner-up: the model FLOPs per step are the
    same, so the rate scales with 1 / step time); None for a plan written before schema 6."""
    pr = plan.predicted
    rate = pr.model_flops_per_s_per_gpu
    if rate is None or step_time_s is None:
        return rate
    return rate * pr.step_time_s / step_time_s


def tflops_text(flops_per_s: float | None) -> str:
    """``412.3`` TFLOP/s (``0.0437`` on a CPU), or ``-`` when not recorded (a plan written
    before schema 6)."""
    return "-" if flops_per_s is None else figure(flops_per_s / TERA)


def _chunk_text(plan: Plan) -> str:
    """Blocks of each pipeline chunk in model order, runs of equal counts as `n (xk)`."""
    runs: list[list[int]] = []
    for n in plan.chunk_blocks():
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(str(n) if k == 1 else f"{n} (x{k})" for n, k in runs)


def _experts_text(plan: Plan) -> str:
    """A MoE plan's routing and how its tokens reach the experts (`Runtime.ep_dispatch`)."""
    m = plan.model
    text = f"{m.experts} per block, {m.top_k} per token"
    if m.routing_groups > 1:
        text += f" within {m.routing_group_top_k} of {m.routing_groups} groups"
    if plan.parallelism.ep <= 1:
        return text + "; no expert parallelism"
    if plan.train.runtime.ep_dispatch == EpDispatch.HIERARCHICAL:
        return text + "; tokens dispatched once per node (DeepEP/HybridEP), NVLink within it"
    return text + "; tokens dispatched by all-to-all (each routed copy)"


def format_plan(plan: Plan) -> str:
    """The human-readable summary table of a plan."""
    p, m, c, t = plan.parallelism, plan.model, plan.cluster, plan.train
    pr = plan.predicted
    mb, tb = pr.memory_breakdown, pr.time_breakdown
    mesh = " x ".join(
        f"{a}({n})" for a, n in zip(plan.mesh.axis_order, plan.mesh.shape, strict=True)
    )
    lines = [
        f"paraplan: {m.name} ({count(m.num_params)} params) on {c.name} "
        f"({c.num_nodes} node{'s' if c.num_nodes > 1 else ''} x {c.gpus_per_node} {c.accelerator})",
        f"          global batch {t.global_batch} x {t.seq_len} tokens, {t.precision}, {t.optimizer}"
        + runtime_note(t.runtime),
        *(
            [f"          attention: {windows_text(m.attention_windows)} (priced over the band)"]
            if m.windowed
            else []
        ),
        "",
        "Plan" + ("" if plan.feasible else "  ** DOES NOT FIT: " + plan.infeasible_reason + " **"),
        f"  degrees       dp={p.dp} tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep}"
        + (" (experts whole, ep folded over tp: expert_tp=1)" if p.expert_tp < p.tp else ""),
        *([f"  experts       {_experts_text(plan)}"] if m.experts else []),
        *(
            [
                f"  mtp           {t.mtp_layers} multi-token-prediction module(s) trained after "
                f"the {m.num_blocks} blocks: each a block, projection and head pass, on the "
                "last stage"
            ]
            if t.mtp_layers
            else []
        ),
        f"  sharding      ZeRO-{p.zero_stage}, sequence parallel {'on' if p.sequence_parallel else 'off'}"
        f", optimizer offload {'on' if p.offload_optimizer else 'off'}",
        f"  mesh          {mesh}  (outermost -> innermost)",
        f"  schedule      {plan.schedule}"
        + (f" (v={p.virtual_stages})" if p.virtual_stages > 1 else "")
        + f", {plan.num_microbatches} micro-batch{'es' if plan.num_microbatches != 1 else ''}"
        f" of {plan.micro_batch_size} sequence{'s' if plan.micro_batch_size != 1 else ''}"
        " per replica",
        *(
            [f"  stages        blocks per chunk in model order: {_chunk_text(plan)}"]
            if p.pp > 1
            else []
        ),
        f"  recompute     {_recompute_summary(plan)}",
        *option_rows(plan),
        "",
        "Predicted",
        f"  step time     {seconds(pr.step_time_s)}   tokens/s {pr.tokens_per_s:,.0f} "
        f"({pr.tokens_per_s / c.num_gpus:,.0f} per GPU)   MFU {pr.mfu:.1%} "
        f"({tflops_text(pr.model_flops_per_s_per_gpu)} TFLOP/s per GPU)",
        f"  bubble        {pr.bubble_fraction:.1%}   exposed communication {seconds(pr.exposed_comm_s)}",
        "",
        f"Memory per GPU (stage {pr.peak_stage}): {_gb(pr.memory_per_gpu_bytes)} of "
        f"{_gb(pr.memory_capacity_bytes)} usable ({UNIT_NOTE})",
    ]
    total = pr.memory_per_gpu_bytes or 1.0
    for name, value in (
        ("params", mb.params_bytes),
        ("grads", mb.grads_bytes),
        ("optimizer", mb.optimizer_bytes),
        ("activations", mb.activations_bytes),
        ("other", mb.other_bytes),
    ):
        bar = "#" * round(30 * value / total)
        lines.append(f"  {name:<12}{_gb(value):>12}  {value / total:6.1%}  {bar}")
    lines += ["", "Time per step"]
    step = pr.step_time_s or 1.0
    for name, value in (
        ("compute", tb.compute_s),
        ("recompute", tb.recompute_s),
        ("comm", tb.comm_s),
        ("bubble", tb.bubble_s),
        ("optimizer", tb.optimizer_s),
    ):
        lines.append(f"  {name:<12}{seconds(value):>12}  {value / step:6.1%}")
    if plan.runners_up:
        rows, ties = _collapse_ties(plan)
        lines += ["", "Runners-up"]
        if ties:
            lines.append(f"  (equivalent to the plan under the cost model: {', '.join(ties)})")
        width = max([len(r.strategy().short()) + 2 for r, _ in rows] + [58])
        scale, unit = (1e3, "ms") if pr.step_time_s < WHOLE_SECONDS_FROM_S else (1.0, "s")
        if rows:
            lines.append(
                f"  {'#':<3}{'strategy':<{width}}{'step ' + unit:>9}{'MFU':>7}{'TFLOP/s/GPU':>12}"
                f"{'GiB/GPU':>8}  lost because"
            )
        else:  # every runner-up ties the plan: say so instead of an empty table
            lines.append("  (no distinct runner-up among those ranked: ask for more with --top K)")
        for i, (r, same) in enumerate(rows, 1):
            lines.append(
                f"  {i:<3}{r.strategy().short():<{width}}"
                f"{r.step_time_s * scale:>9.3f}{r.mfu:>7.1%}"
                f"{tflops_text(model_flops_per_s_per_gpu(plan, r.step_time_s)):>12}"
                f"{r.memory_per_gpu_bytes / GIB:>8.1f}  "
                f"{r.lost_because}"
            )
            if same:
                lines.append(f"     (equivalent: {', '.join(same)})")
    return "\n".join(lines)


def _collapse_ties(plan: Plan) -> tuple[list[tuple[RunnerUp, list[str]]], list[str]]:
    """Runners-up with exact ties folded in: a row whose predicted step time and memory equal
    the plan's, or an earlier row's (a DP/CP swap, an order of equal stages), is named beside
    it instead of getting a row of its own. Returns (rows with their equivalents, the shapes
    equivalent to the plan itself)."""
    pr = plan.predicted

    def key(step_s: float, memory_bytes: float) -> tuple[float, float]:
        return (round(step_s, 9), round(memory_bytes))

    mine = key(pr.step_time_s, pr.memory_per_gpu_bytes)
    ties: list[str] = []
    rows: list[tuple[RunnerUp, list[str]]] = []
    seen: dict[tuple[float, float], list[str]] = {}
    for r in plan.runners_up:
        k = key(r.step_time_s, r.memory_per_gpu_bytes)
        if k == mine:
            ties.append(r.strategy().short())
        elif k in seen:
            seen[k].append(r.strategy().short())
        else:
            seen[k] = []
            rows.append((r, seen[k]))
    return rows, ties


def _recompute_summary(plan: Plan) -> str:
    """The recompute decisions in words: the policy, the blocks per kind when it is
    per-layer, the time it adds and the memory it saves."""
    policy = plan.recompute_policy
    blocks = [d for d in plan.layers if d.name.startswith("block")]
    text = str(policy)
    if policy == Recompute.PER_LAYER:
        kinds = (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE)
        counts = {k: sum(d.recompute == k for d in blocks) for k in kinds}
        text = "per-layer solver: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        text += f" of {len(blocks)} blocks"
    modules = plan.train.runtime.recompute_modules
    if policy in (Recompute.SELECTIVE, Recompute.PER_LAYER) and modules != (
        RecomputeModule.CORE_ATTN,
    ):  # Megatron-Core's --recompute-modules (else the attention core, as documented)
        text += f" (redoes {', '.join(modules) or 'nothing'})"
    pr = plan.predicted
    if policy != Recompute.NONE:
        rc = pr.time_breakdown.recompute_s
        text += (
            f"; {seconds(rc, sign=True)} per step ({rc / (pr.step_time_s - rc or 1.0):.1%} over no "
            f"recompute), saves {_gb(pr.recompute_saved_bytes)} per GPU"
        )
    return text


def explain(plan: Plan) -> str:
    """What bounds the plan (memory, bubble, communication) and what the next best costs."""
    pr = plan.predicted
    tb, mb = pr.time_breakdown, pr.memory_breakdown
    out = [f"Plan for {plan.model.name} on {plan.cluster.name}: {plan.strategy().short()}."]
    if not plan.feasible:
        out.append(f"It does NOT fit: {plan.infeasible_reason}.")
    use = pr.memory_per_gpu_bytes / pr.memory_capacity_bytes
    parts = {
        "parameters": mb.params_bytes,
        "gradients": mb.grads_bytes,
        "optimizer states": mb.optimizer_bytes,
        "activations": mb.activations_bytes,
        "buffers and runtime": mb.other_bytes,
    }
    biggest = max(parts, key=lambda k: parts[k])
    verdict = "memory-bound" if use >= MEMORY_BOUND_SHARE else "not memory-bound"
    out.append(
        f"Memory: {use:.0%} of the usable {_gb(pr.memory_capacity_bytes)} per GPU "
        f"(stage {pr.peak_stage}) — {verdict}; the largest share is {biggest} "
        f"({_gb(parts[biggest])})."
    )
    step = pr.step_time_s
    shares = {
        "the pipeline bubble": tb.bubble_s,
        "exposed communication": tb.comm_s,
        "recomputation": tb.recompute_s,
        "the optimizer step": tb.optimizer_s,
    }
    rate = pr.model_flops_per_s_per_gpu
    fp8 = plan.train.precision == Precision.FP8  # MFU against the bf16 peak (config.py)
    peak_name = "bf16 peak" if fp8 else "peak"
    achieved = (  # MFU = achieved model FLOP/s over the dense peak (PaLM Appendix B)
        f"{tflops_text(rate)} of the {tflops_text(rate / pr.mfu)} TFLOP/s {peak_name} per GPU"
        if rate is not None and pr.mfu > 0
        else f"{tflops_text(rate)} TFLOP/s per GPU"
    )
    out.append(
        f"Time: {seconds(step)} per step, {tb.compute_s / step:.0%} useful compute, MFU {pr.mfu:.1%} "
        f"({achieved}), {pr.tokens_per_s / plan.cluster.num_gpus:,.0f} tokens/s per GPU."
    )
    if fp8:
        out.append(
            "fp8 runs only the blocks' linear layers in fp8 (their GEMMs at up to twice the bf16 "
            "rate, plus the casts dynamic scaling adds), so MFU is quoted against the bf16 peak."
        )
    overhead = max(shares, key=lambda k: shares[k])
    if shares[overhead] / step < 0.02:
        out.append("Nearly all of the step is compute: the plan is compute-bound.")
    else:
        out.append(
            f"The largest overhead is {overhead}: {seconds(shares[overhead])} "
            f"({shares[overhead] / step:.0%} of the step)."
        )
        out.append("  " + _advice(overhead, plan))
    out += option_lines(plan)  # PowerSGD, offload, async pipeline: their hidden costs
    if plan.runners_up:
        r = plan.runners_up[0]
        out.append(
            f"Next best: {r.strategy().short()} "
            f"at {seconds(r.step_time_s)} per step ({r.step_time_s / step - 1:+.1%}), "
            f"{gib(r.memory_per_gpu_bytes, 1)} per GPU: {r.lost_because}."
        )
    else:
        out.append("No runner-up was recorded (re-plan with --top K to list alternatives).")
    return "\n".join(out)


def _advice(overhead: str, plan: Plan) -> str:
    p = plan.parallelism
    if overhead == "the pipeline bubble":
        return (
            f"With pp={p.pp} and {plan.num_microbatches} micro-batches the bubble is "
            f"{plan.predicted.bubble_fraction:.0%}; more micro-batches (a larger global batch) "
            "or more virtual stages would shrink it, memory permitting."
        )
    if overhead == "exposed communication":
        return (
            "Communication that compute cannot hide: faster links, a mesh order that keeps the "
            "chattiest axis inside a node, or larger micro-batches to hide it behind compute."
        )
    if overhead == "recomputation":
        return "Memory forces recomputation; more GPUs or more sharding (ZeRO/TP) would avoid it."
    return "The optimizer step is slow (offloaded or unsharded); more ZeRO sharding shortens it."


def format_profile(profile: ModelProfile) -> str:
    """A per-layer table of a profile (identical consecutive blocks folded into one row)."""
    p = profile
    lines = [
        f"{p.name}: {count(p.num_params)} params, {p.num_blocks} blocks, seq {p.seq_len}, "
        f"{p.act_dtype_bytes}-byte activations"
        + (f", times measured on {p.measured_on}" if p.measured_on else ", times: roofline"),
        "",
        f"{'layer':<16}{'params':>12}{'fwd GFLOP':>11}{'bwd GFLOP':>11}{'saved MiB':>10}"
        f"{'out MiB':>9}{'tmp MiB':>9}{'fwd ms':>9}{'bwd ms':>9}   (per sequence; MiB = 2^20 B)",
    ]
    rows: list[tuple[str, tuple]] = []
    for x in p.layers:
        key = (
            x.params + x.expert_params,
            x.fwd_flops,
            x.bwd_flops,
            x.act_tp_bytes + x.act_replicated_bytes,
            x.output_bytes,
            max(x.fwd_tmp_bytes, x.bwd_tmp_bytes),
            x.fwd_time_s,
            x.bwd_time_s,
        )
        if rows and x.kind == LayerKind.BLOCK and rows[-1][1][:6] == key[:6]:
            first = rows[-1][0].split("..")[0]
            rows[-1] = (f"{first}..{x.name.split('.')[-1]}", rows[-1][1])
            continue
        rows.append((x.name, key))
    for name, (params, f, b, saved, out, tmp, ft, bt) in rows:
        ms = lambda t: "-" if t is None else f"{t * 1e3:.2f}"  # noqa: E731
        lines.append(
            f"{name:<16}{params:>12,}{f / 1e9:>11.3f}{b / 1e9:>11.3f}{saved / MIB:>10.2f}"
            f"{out / MIB:>9.2f}{tmp / MIB:>9.2f}{ms(ft):>9}{ms(bt):>9}"
        )
    return "\n".join(lines)
