"""Where the accelerator catalog's figures come from (`hardware.Accelerator.sources`)."""

from __future__ import annotations

# ------------------------------------------------------------------------------------
_A100_DS = (
    "NVIDIA A100 Tensor Core GPU datasheet (SXM), https://www.nvidia.com/content/dam/en-zz/"
    "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_H100_DS = (
    "NVIDIA H100 Tensor Core GPU datasheet, "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
)
_H200_DS = (
    "NVIDIA H200 Tensor Core GPU datasheet (SXM), https://www.nvidia.com/en-us/data-center/h200/"
)
_B200_DS = "NVIDIA HGX B200 specifications (per GPU), https://www.nvidia.com/en-us/data-center/hgx/"
_GB200_DS = (
    "NVIDIA GB200 NVL72 specifications, per rack of 72 GPUs (FP16/BF16 tensor 360 PFLOPS and "
    "FP8 720 with sparsity, FP32 5,760 TFLOPS, HBM3e 13.4 TB at 576 TB/s, NVLink 130 TB/s), "
    "divided by 72, https://www.nvidia.com/en-us/data-center/gb200-nvl72/; 186 GB per GPU as "
    "MLPerf system descriptions state it (e.g. mlcommons inference_results_v6.1, "
    "GB200-NVL72_GB200-186GB)"
)
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"
_V100_DS = (
    "NVIDIA Tesla V100 GPU datasheet (SXM2), https://images.nvidia.com/content/technologies/"
    "volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_MI300X_DS = (
    "AMD Instinct MI300X data sheet, https://www.amd.com/content/dam/amd/en/documents/"
    "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
)
_LI_2020 = (
    "Li et al., 'Evaluating Modern GPU Interconnect: PCIe, NVLink, NV-SLI, NVSwitch and "
    "GPUDirect', IEEE TPDS 2020 (arXiv:1903.04611)"
)
# Per-step latencies (alpha of the alpha-beta model); none is on a datasheet.
_NVLINK_STEP_S = 3e-6
_NVLINK_LAT = f"assumption: ~3 us per step over NVLink/NVSwitch/xGMI, the order in {_LI_2020}"
_PCIE_STEP_S = 5e-6
_PCIE_LAT = f"assumption: ~5 us per step over PCIe peer-to-peer, the order in {_LI_2020}"
_RDMA_STEP_S = 5e-6
_IB_LAT = (
    "assumption: ~5 us per step across InfiniBand/RoCE (NIC, switch hops, NCCL proxy), the low "
    "end of small-message nccl-tests latencies; calibrate"
)
_TCP_STEP_S = 2e-5
_TCP_LAT = "assumption: ~20 us per step over cloud TCP Ethernet without RDMA; calibrate"
_RUNTIME_OVERHEAD = (
    "assumption: ~1 GiB per process for the CUDA/ROCm context (a few hundred MiB with CUDA 12 "
    "lazy loading), cuBLAS workspaces and NCCL buffers (NCCL_BUFFSIZE 4 MiB per channel and "
    "peer, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html); calibrate with "
    "torch.cuda.mem_get_info after init_process_group"
)
_EFF_A100 = (
    "assumption: 0.75 of peak for large bf16 GEMMs. End-to-end MFU of 52% (Narayanan et al., "
    "SC21, arXiv:2104.04473) and ~56% (Korthikanti et al. 2022, arXiv:2205.05198) include "
    "communication, pipeline bubble and non-GEMM ops, so GEMMs alone run faster"
)
_EFF_HOPPER = (
    "assumption: 0.70 of dense bf16 peak for large GEMMs (clocks drop under tensor-core load); "
    "end-to-end MFU 38-43% on 8K-16K H100s (Llama 3 paper, arXiv:2407.21783, Table 4) also "
    "pays for communication and non-GEMM ops"
)
_EFF_B200 = "assumption: 0.65 of dense bf16 peak (young software stack, no published GEMM study)"
_EFF_MI300X = (
    "assumption: 0.50 of dense bf16 peak: public hipBLASLt GEMM measurements on MI300X reach "
    "about half of the datasheet figure; calibrate"
)
_EFF_L4 = "assumption: 0.60 of dense bf16 peak (72 W part: clocks drop under sustained load)"
_EFF_V100 = "assumption: 0.70 of the fp16 tensor-core peak for large cuBLAS GEMMs; calibrate"
_NVLINK = "{ds}; NVLink {bidi} GB/s bidirectional per GPU, halved"
_HBM2E = (
    "6 HBM2e stacks of 16 GB at the H100 PCIe's 0.4 TB/s per stack (2.0 TB/s over 5 stacks, "
    "NVIDIA H100 datasheet)"
)
_NET_400G = (
    "NVIDIA {system} datasheet: 8x single-port ConnectX-7, up to 400 Gb/s InfiniBand, for 8 "
    "GPUs -> 50 GB/s per GPU, https://www.nvidia.com/en-us/data-center/{page}/"
)
_C2C = (
    "NVIDIA Grace Blackwell superchip: NVLink-C2C 900 GB/s bidirectional between a Grace CPU "
    "and its two Blackwell GPUs -> 225 GB/s per GPU and direction (host offload)"
)
_NET_GB200 = (
    "MLPerf GB200 NVL72 system descriptions: one ConnectX-7 (400 Gb/s) per GPU for the network "
    "beyond the NVLink domain -> 50 GB/s per GPU"
)
_EFF_GB200 = "assumption: as b200 (the same Blackwell GPU at 1200 W instead of 1000 W)"
