"""Run the trainers' own configuration loaders on exported files (a child process of the
export tests): `python tests/export_loaders.py torchtitan|megatron|deepspeed` reads a JSON list
of {"path", "world_size", "dp"} on stdin and prints, on its last line, a JSON list of what each
loader made of each file. A loader that rejects a file fails the run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def torchtitan_view(item: dict[str, Any]) -> dict[str, Any]:
    """torchtitan >= 0.3: ConfigManager.parse_args on `--module llama3 --config llama3_8b` (or
    the item's `module` and `config`) and the file's keys as overrides."""
    from torchtitan.config.manager import ConfigManager

    from paraplan.export.torchtitan import cli_args

    text = Path(item["path"]).read_text()
    config = ConfigManager().parse_args(
        [
            "--module",
            item.get("module", "llama3"),
            "--config",
            item.get("config", "llama3_8b"),
            *cli_args(text),
        ]
    )
    par, tr, ac = config.parallelism, config.training, config.activation_checkpoint
    parts = par.module_fqns_per_model_part
    return {
        "replicate": par.data_parallel_replicate_degree,
        "shard": par.data_parallel_shard_degree,
        "reshard": par.fsdp_reshard_after_forward,
        "tp": par.tensor_parallel_degree,
        "sp": par.enable_sequence_parallel,
        "pp": par.pipeline_parallel_degree,
        "cp": par.context_parallel_degree,
        "ep": par.expert_parallel_degree,
        "schedule": par.pipeline_parallel_schedule,
        "chunks": len(parts) if parts else None,
        "chunk_modules": sum(len(p) for p in parts) if parts else None,
        "pp_microbatch": par.pipeline_parallel_microbatch_size,
        "local_batch": tr.local_batch_size,
        "global_batch": tr.global_batch_size,
        "seq_len": tr.seq_len,
        "param_dtype": tr.mixed_precision_param,
        "ac": "none" if ac is None else type(ac).__qualname__.split(".")[0],
        "cpu_offload": tr.enable_cpu_offload,
        "compile": config.compile.enable,
        "async_tp": config.compile.enable_async_tensor_parallel,
    }


_MEGATRON_DEST = {
    "fp8-format": "fp8",
    "num-experts": "num_moe_experts",
    "fp8-param-gather": "fp8_param",
    "swiglu": "gated_linear_unit",
}
"""Megatron-LM flags whose TransformerConfig field is not the flag's name (arguments.py's
`dest`, or `core_transformer_config_from_args`: `num_experts` -> `num_moe_experts`)."""
_MEGATRON_TRAINING = {
    "seq-length",
    "max-position-embeddings",
    "micro-batch-size",
    "global-batch-size",
    "group-query-attention",
    "bf16",
    "fp16",
    "use-distributed-optimizer",
    "use-megatron-fsdp",
    "data-parallel-sharding-strategy",
    "optimizer-cpu-offload",
    "optimizer-offload-fraction",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "grad-reduce-in-bf16",
    "num-virtual-stages-per-pipeline-rank",
    "untie-embeddings-and-output-weights",
}
"""Megatron-LM training arguments (megatron/training/arguments.py) that are not
TransformerConfig fields; they go to megatron-core's other configs below."""


def megatron_view(item: dict[str, Any]) -> dict[str, Any]:
    """megatron-core's own configs built from the arguments as Megatron-LM's
    `core_transformer_config_from_args` does (flag --x-y is field x_y), each validating
    itself, and its micro-batch calculator."""
    import dataclasses

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_moe_layer_pattern,
    )
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    from paraplan.export.megatron import parse_args

    args = parse_args(Path(item["path"]).read_text())
    # Megatron-LM builds MLATransformerConfig under --multi-latent-attention (its
    # `core_transformer_config_from_args`), passing --q-lora-rank's default None (full rank)
    config_class = MLATransformerConfig if "multi-latent-attention" in args else TransformerConfig
    fields = {f.name for f in dataclasses.fields(config_class)}
    kw: dict[str, Any] = {}
    for flag, value in args.items():
        name = _MEGATRON_DEST.get(flag, flag.replace("-", "_"))
        if flag in _MEGATRON_TRAINING:
            continue
        if flag == "window-size":  # Megatron-LM's `tuple_type`
            kw["window_size"] = tuple(int(i) for i in str(value).strip("()").split(","))
            continue
        if flag in ("window-attn-skip-freq", "moe-layer-freq"):  # Megatron-LM's `moe_freq_type`:
            text = str(value)  # a Python list expression (its `_eval_pattern`), else a number
            kw[name] = eval(text, {"__builtins__": {}}) if "[" in text else int(text)
            continue
        if name not in fields:
            raise ValueError(f"--{flag} is neither a TransformerConfig field nor a known argument")
        field_type = str(next(f.type for f in dataclasses.fields(config_class) if f.name == name))
        if value is not None and "List" in field_type:  # nargs="*" (--recompute-modules)
            kw[name] = value.split()
            continue
        kw[name] = True if value is None else (int(value) if "int" in field_type else value)
    dtype = torch.bfloat16 if "bf16" in args else torch.float16 if "fp16" in args else torch.float32
    if "num-virtual-stages-per-pipeline-rank" in args:
        kw["virtual_pipeline_model_parallel_size"] = int(
            args["num-virtual-stages-per-pipeline-rank"]
        )
    if config_class is MLATransformerConfig:
        kw.setdefault("q_lora_rank", None)
    config = config_class(
        **kw,
        bf16="bf16" in args,
        fp16="fp16" in args,
        params_dtype=dtype,
        pipeline_dtype=dtype,
    )
    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer="use-distributed-optimizer" in args,
        use_megatron_fsdp="use-megatron-fsdp" in args,
        data_parallel_sharding_strategy=args.get("data-parallel-sharding-strategy") or "no_shard",
        overlap_grad_reduce="overlap-grad-reduce" in args,
        overlap_param_gather="overlap-param-gather" in args,
        # Megatron-LM accumulates and reduces in fp32 under --bf16 unless told otherwise
        grad_reduce_in_fp32="bf16" in args and "grad-reduce-in-bf16" not in args,
    )
    opt = OptimizerConfig(
        bf16="bf16" in args,
        use_distributed_optimizer=ddp.use_distributed_optimizer,
        optimizer_cpu_offload="optimizer-cpu-offload" in args,
        optimizer_offload_fraction=float(args.get("optimizer-offload-fraction") or 0.0),
    )
    dp = item["world_size"] // (
        config.tensor_model_parallel_size
        * config.pipeline_model_parallel_size
        * config.context_parallel_size
    )
    calc = ConstantNumMicroBatchesCalculator(
        int(args["global-batch-size"]),
        int(args["micro-batch-size"]),
        dp,
        decrease_batch_size_if_needed=False,
        rank=0,
    )
    windows = [
        (config.window_size[0] + 1 if config.window_size[0] >= 0 else 0)
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n)
        else 0
        for n in range(1, config.num_layers + 1)  # megatron-core counts layers from 1
    ]
    return {
        "windows": windows if any(windows) else [],
        "tp": config.tensor_model_parallel_size,
        "kv_channels": config.kv_channels,
        "ffn": config.ffn_hidden_size,
        "gated": config.gated_linear_unit,
        "top_k": config.moe_router_topk if config.num_moe_experts else 0,
        "moe_ffn": config.moe_ffn_hidden_size,
        "shared_expert_ffn": config.moe_shared_expert_intermediate_size,
        "moe_pattern": get_moe_layer_pattern(config) if config.num_moe_experts else [],
        "flex_backend": config.moe_flex_dispatcher_backend,
        "router_groups": [config.moe_router_num_groups, config.moe_router_group_topk],
        "mtp_layers": config.mtp_num_layers,
        "mla": (
            [
                config.q_lora_rank,
                config.kv_lora_rank,
                config.qk_head_dim,
                config.qk_pos_emb_head_dim,
                config.v_head_dim,
            ]
            if config.multi_latent_attention
            else None
        ),
        "untied": "untie-embeddings-and-output-weights" in args,
        "pp": config.pipeline_model_parallel_size,
        "cp": config.context_parallel_size,
        "vpp": config.virtual_pipeline_model_parallel_size,
        "sp": config.sequence_parallel,
        "tp_comm_overlap": config.tp_comm_overlap,
        "ep": config.expert_model_parallel_size,
        "etp": config.expert_tensor_parallel_size,
        "dispatcher": config.moe_token_dispatcher_type,
        "ep_overlap": [config.overlap_moe_expert_parallel_comm, config.delay_wgrad_compute],
        "recompute": [config.recompute_granularity, config.recompute_method],
        "recompute_modules": config.recompute_modules,
        "bf16": config.bf16,
        "distributed_optimizer": ddp.use_distributed_optimizer,
        "dp_overlap": [ddp.overlap_grad_reduce, ddp.overlap_param_gather],
        "grad_reduce_in_fp32": ddp.grad_reduce_in_fp32,
        "fp8_param": config.fp8_param,
        "fsdp_strategy": ddp.data_parallel_sharding_strategy if ddp.use_megatron_fsdp else None,
        "cpu_offload": opt.optimizer_cpu_offload,
        "microbatches": calc.get(),
        "micro_batch": calc.micro_batch_size,
        "dp": dp,
    }


class DataParallelGroup:
    """The `mpu` DeepSpeed asks for the data-parallel world size (Megatron's interface)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def deepspeed_view(item: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeedConfig on the JSON with the plan's data-parallel world size (its batch
    assertion checks train_batch = micro x accumulation x dp)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    config = DeepSpeedConfig(item["path"], mpu=DataParallelGroup(item["dp"]))
    offload = config.zero_config.offload_optimizer
    param = config.zero_config.offload_param
    return {
        "world_size": config.world_size,
        "train_batch": config.train_batch_size,
        "micro_batch": config.train_micro_batch_size_per_gpu,
        "accumulation": config.gradient_accumulation_steps,
        "zero": int(config.zero_optimization_stage),
        "offload": None
        if offload is None
        else str(getattr(offload.device, "value", offload.device)),
        "offload_param": None
        if param is None
        else str(getattr(param.device, "value", param.device)),
        "bf16": config.bfloat16_config.enabled,
        "autotp": config.tensor_parallel_config.autotp_size,
        "pipeline": [config.pipeline["stages"], config.pipeline["activation_checkpoint_interval"]],
    }


def main() -> None:
    target = sys.argv[1]
    manifest = json.loads(sys.stdin.read())
    if target == "deepspeed":  # DeepSpeedConfig reads the world size from its process group
        import deepspeed
        import deepspeed.comm.torch as ds_torch

        # Its CPU backend would JIT-compile a shared-memory all-reduce (C++, ~30 s on two
        # cores, again for every checkout path) under a lock file in ~/.cache/torch_extensions
        # that a killed build leaves behind, making every later build wait forever. Reading a
        # config needs no all-reduce.
        ds_torch.build_shm_op = lambda: None
        os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        deepspeed.init_distributed(dist_backend="gloo")
    view = {"torchtitan": torchtitan_view, "megatron": megatron_view, "deepspeed": deepspeed_view}
    out = [view[target](item) for item in manifest]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
