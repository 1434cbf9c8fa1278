"""Operands that come from memory, as they do in a training step.

A microbenchmark that calls one kernel again and again on the same tensors measures it with its
operands in the caches. In a training step they are not: between the operator that writes an
activation and the one that reads it run the rest of the layer, and the backward reads what the
forward saved long before, so the step's working set is far beyond the last-level cache. On
this 2-core EPYC (1 MiB L2 per core, 32 MiB L3) an fp32 `x * 0.5` on a 512 KiB tensor took
20 us with its input in the caches and 53 us with it in memory; GPT-2 tiny's block ran its
multiplications at 42-62 us each (per-operator times under a TorchDispatchMode, 2026-11-25),
and its small GEMMs 10-40% slower than in a hot loop. GPUs have the same effect at a larger
scale (an H100's 50 MB L2).

`ColdOperands` hands out views of one large buffer, a different slot on every call, so each
call's operands were last touched a whole buffer (at least twice the last-level cache) ago:
they come from memory. Outputs are allocated fresh, as an eager model's are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

COLD_POOL_BYTES = 128 * 2**20
"""Bytes of the rotating buffer: four times this machine's 32 MiB L3, more than twice a 50 MB
GPU L2 (a CUDA device's own L2 size doubles it when larger)."""
MAX_SLOTS = 4096
"""Slots precomputed per set of shapes (views cost ~1 us each to make: made once, up front)."""
ALIGN_ELEMS = 128
"""Every view starts at a multiple of this many elements (256-512 bytes): fused attention and
vectorized kernels on a GPU need 16-byte aligned operands (an unaligned one is a CUDA error
or a slower kernel), and a freshly allocated tensor is aligned so too."""


def pool_bytes(device: torch.device) -> int:
    """Bytes of the rotating buffer on `device`: `COLD_POOL_BYTES`, or twice the GPU's L2
    cache when that is larger."""
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
        return max(COLD_POOL_BYTES, 2 * l2)
    return COLD_POOL_BYTES


class ColdPool:
    """One rotating buffer per dtype and device, shared by every benchmark of a calibration
    (filling it once also evicts whatever the caches held)."""

    def __init__(self, dtype: torch.dtype, device: torch.device, nbytes: int | None = None):
        elem = torch.tensor([], dtype=dtype).element_size()
        # filled with ones: resident, and no denormals or NaNs to slow a kernel down
        self.buffer = torch.ones((nbytes or pool_bytes(device)) // elem, dtype=dtype, device=device)

    def operands(
        self, shapes: Sequence[tuple[int, ...]], *, requires_grad: bool = False
    ) -> ColdOperands:
        """Rotating tensors of `shapes` in this buffer (leaves requiring grad if asked)."""
        return ColdOperands(self.buffer, shapes, requires_grad=requires_grad)


class ColdOperands:
    """Rotating views of one buffer: `next()` gives a tuple of tensors of `shapes`, in a slot
    the previous calls did not touch (the whole buffer is visited before a slot comes back).
    Shapes larger than the buffer get one slot (they do not fit any cache anyway)."""

    def __init__(
        self,
        buffer: torch.Tensor,
        shapes: Sequence[tuple[int, ...]],
        *,
        requires_grad: bool = False,
    ) -> None:
        sizes = [max(1, _numel(s)) for s in shapes]
        slot = sum(_aligned(size) for size in sizes)
        if slot > buffer.numel():  # beyond the pool: fresh tensors, one slot
            buffer = torch.ones(slot, dtype=buffer.dtype, device=buffer.device)
        slots = max(1, min(MAX_SLOTS, buffer.numel() // slot))
        stride = buffer.numel() // slots // ALIGN_ELEMS * ALIGN_ELEMS
        self._views: list[tuple[torch.Tensor, ...]] = []
        for i in range(slots):
            offset, views = i * stride, []
            for shape, size in zip(shapes, sizes, strict=True):
                v = buffer[offset : offset + size].view(shape)
                views.append(v.detach().requires_grad_() if requires_grad else v)
                offset += _aligned(size)
            self._views.append(tuple(views))
        self._next = 0

    def __len__(self) -> int:
        return len(self._views)

    def next(self) -> tuple[torch.Tensor, ...]:
        """The next slot's tensors."""
        views = self._views[self._next]
        self._next = (self._next + 1) % len(self._views)
        return views


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _aligned(n: int) -> int:
    """`n` elements rounded up to a multiple of `ALIGN_ELEMS`."""
    return -(-n // ALIGN_ELEMS) * ALIGN_ELEMS
