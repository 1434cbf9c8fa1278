"""MosaicML's MPT throughput tables (benchmarks/validate_mpt.py), held out whole: the models
reproduce the tables' parameter counts, and the cost model stays within docs/validation.md's
recorded figures on the published step times and orders."""

from __future__ import annotations

from tests.benchmark_module import benchmark_module


def _module():
    return benchmark_module("validate_mpt")


def test_every_mpt_model_has_the_published_parameter_count():
    """The table's NumParams column (MosaicML's own count of each run's model, which grows with
    the learned position embeddings' sequence) against paraplan's analytic model: exact."""
    vm = _module()
    rows = vm.load_rows()
    assert len(rows) == 216
    for row in rows:
        profile = vm.mpt_spec(row).to_profile(seq_len=row.seq_len)
        assert profile.num_params == row.num_params, (row.model, row.seq_len)


def test_mpt_step_times_and_orders_within_the_recorded_bounds():
    """Up to 8K tokens (166 bf16 rows): mean |error| 7.2% and max 21.9% recorded, bounded at
    9% and 25%; 588 of 599 pairs ordered as published, bounded at 95%. The long-context rows
    (43, over 8K tokens), predicted too fast by 20% on average where MPT's Triton attention
    dominates the step, within their recorded 20.0% (bounded at 23%)."""
    vm = _module()
    results = vm.run()
    short = [r for r in results if vm.group_of(r) == "bf16"]
    long = [r for r in results if vm.group_of(r) == "bf16 long"]
    s, lg = vm.summary(short), vm.summary(long)
    assert s["rows"] == 166 and lg["rows"] == 43
    assert s["mean_abs_error"] <= 0.09 and s["max_abs_error"] <= 0.25
    assert lg["mean_abs_error"] <= 0.23
    same, total = vm.order_pairs(short + long)
    assert total >= 500 and same >= 0.95 * total


def test_every_mpt_configuration_that_ran_fits_its_gpu() -> None:
    """The published configurations ran, MosaicML's micro-batches chosen near what fits: the
    cost model has each of the 216 fit its GPU's memory (no headroom). With torch's loss
    (2 more fp32 logits-sized buffers; llm-foundry's MPT runs flash-attn's fused one) 59 of
    them were priced over it, by up to 23%."""
    vm = _module()
    results = vm.run()
    assert [r.row for r in results if not r.fits] == []
    assert max(r.predicted_memory_bytes / r.capacity_bytes for r in results) > 0.85
