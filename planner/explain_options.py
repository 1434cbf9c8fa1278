"""`paraplan explain` lines for PowerSGD, offload and the asynchronous pipeline: what each
option saves, what it costs that the totals hide, and how it changes training."""

from __future__ import annotations

from .cost.compression import MIN_COMPRESSION_RATE, POWERSGD_START_ITER
from .cost.schedules import is_split_backward, pending_w_share
from .plan import Plan

_GB = 2**30


def option_rows(plan: Plan) -> list[str]:
    """The plan table's row for the options the plan takes (none when it takes none)."""
    p = plan.parallelism
    taken = [
        name
        for name, on in (
            (f"PowerSGD rank {p.powersgd_rank}", p.powersgd_rank is not None),
            ("parameter offload", p.offload_params),
            ("activation offload", p.offload_activations),
            ("asynchronous pipeline (PipeDream-2BW)", p.async_pipeline),
        )
        if on
    ]
    return [f"  options       {', '.join(taken)}"] if taken else []


def option_lines(plan: Plan) -> list[str]:
    """One line or two per option the plan takes (none when it takes none)."""
    p, h, step = plan.parallelism, plan.predicted.hidden_costs, plan.predicted.step_time_s
    out: list[str] = []
    if p.powersgd_rank is not None:
        saved = h.uncompressed_step_time_s - step
        out.append(
            f"PowerSGD rank {p.powersgd_rank} (Vogels et al. 2019) compresses the gradient "
            f"all-reduce to {h.compression_wire_ratio:.2%} of its bytes; predicted saving "
            f"{saved:+.3f} s per step ({saved / h.uncompressed_step_time_s:+.1%}) against the "
            f"uncompressed {h.uncompressed_step_time_s:.3f} s."
        )
        out.append(
            f"  Hidden costs: {h.compression_compute_s * 1e3:.2f} ms of compression compute per "
            f"step and {h.error_feedback_bytes / _GB:.2f} GiB of error-feedback buffer per GPU. "
            f"It changes the training math (a low-rank gradient with error feedback; chosen "
            f"with --allow-compression); torch's hook all-reduces uncompressed for the first "
            f"{POWERSGD_START_ITER} steps and leaves vectors and matrices that shrink less "
            f"than {MIN_COMPRESSION_RATE}x uncompressed."
        )
    if p.offload_params or p.offload_activations:
        what = " and ".join(
            name
            for name, on in (
                ("parameter and gradient shards", p.offload_params),
                ("saved activations", p.offload_activations),
            )
            if on
        )
        out.append(
            f"Offload: {what} live on the host, freeing {h.offload_saved_bytes / _GB:.2f} GiB "
            f"per GPU; hidden costs: {h.offload_pcie_bytes / _GB:.2f} GiB over PCIe per step, "
            f"{h.offload_exposed_s:.3f} s of it not hidden under compute"
            + (
                f"; the host holds {h.offload_host_bytes / _GB:.1f} GiB of model states per GPU."
                if h.offload_host_bytes
                else "."
            )
        )
    out += _split_backward_lines(plan)
    if p.async_pipeline:
        out.append(
            f"Asynchronous pipeline (PipeDream-2BW): no flush, so no bubble; hidden costs: "
            f"{h.stashed_weight_bytes / _GB:.2f} GiB per GPU for the stashed weight version, and "
            f"weight staleness {h.staleness_steps} (gradients from the weights of the step "
            f"before; chosen with --allow-async). paraplan's executor does not run it."
        )
    return out


_SCHEDULE_SOURCES = {
    "interleaved_zb": "ZB-H1, Qi et al. 2023",
    "zbv": "ZB-V, Qi et al. 2023",
    "dualpipev": "DualPipeV, DeepSeek-V3 2024",
}
"""Where each split-backward schedule comes from (docs/cost-model.md §10)."""


def _split_backward_lines(plan: Plan) -> list[str]:
    """What a zero-bubble or DualPipeV schedule buys (its bubble against 1F1B's closed form)
    and what it costs (the pending weight gradients' memory); none for other schedules."""
    p, pred = plan.parallelism, plan.predicted
    if not is_split_backward(plan.schedule):
        return []
    m = plan.num_microbatches
    share = pending_w_share(
        plan.schedule,
        pp=p.pp,
        stage=pred.peak_stage,
        num_microbatches=m,
        virtual_stages=p.virtual_stages,
    )
    pending_bytes = share * pred.memory_breakdown.activations_bytes
    one_f_one_b = (p.pp - 1) / (m + p.pp - 1)
    return [
        f"Schedule {plan.schedule} ({_SCHEDULE_SOURCES[str(plan.schedule)]}) splits each "
        f"backward into B (input gradient, which the previous stage waits for) and W (weight "
        f"gradient, run later to fill the bubble): bubble {pred.bubble_fraction:.1%} of the "
        f"step, against {one_f_one_b:.1%} for 1F1B's (p-1)/(m+p-1) at p={p.pp}, m={m}.",
        f"  Hidden cost: micro-batches waiting for their W keep their GEMM output gradients "
        f"(18/34 of their activations): {pending_bytes / _GB:.2f} GiB of the activations on "
        f"stage {pred.peak_stage}; torch 2.13 runs it without FSDP only (ZeRO-0/1).",
    ]
