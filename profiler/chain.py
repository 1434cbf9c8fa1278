"""Find a model's layer chain: the repeated blocks, with everything before them as the
embedding and everything after them (loss included) as the head."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True, slots=True)
class BlockList:
    """The repeated blocks of a model."""

    container: str
    """Qualified name of the ModuleList/Sequential holding the blocks ('' for the root)."""
    names: tuple[str, ...]
    """Qualified name of each block."""
    modules: tuple[nn.Module, ...]
    """The block modules, in execution order."""


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module, container: str | None = None) -> BlockList:
    """The model's blocks: the `container` named, or else the ModuleList/Sequential whose
    children are identical (repeated blocks) holding the most parameters; failing that, the
    container holding the most parameters (ties: more children)."""
    if container is not None:
        try:
            found = model.get_submodule(container)
        except AttributeError:
            raise ValueError(
                f"blocks={container!r}: no such submodule; name a ModuleList/Sequential such as "
                f"{_suggest(model)}"
            ) from None
        if not isinstance(found, nn.ModuleList | nn.Sequential) or len(found) < 1:
            raise ValueError(
                f"blocks={container!r} is a {type(found).__name__}, not a non-empty ModuleList "
                "or Sequential of blocks"
            )
        return _block_list(container, found)
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList | nn.Sequential) and len(mod) >= 1:
            children = list(mod)
            identical = all(same_structure(children[0], c) for c in children[1:])
            key = (identical and _params(mod) > 0, _params(mod), len(mod))
            if best is None or key > best[0]:
                best = (key, name, mod)
    if best is None or best[0][1] == 0:
        raise ValueError(
            f"{type(model).__name__}: found no ModuleList/Sequential of blocks with parameters; "
            f"pass blocks='<qualified name>' (candidates: {_suggest(model)})"
        )
    return _block_list(best[1], best[2])


def _block_list(name: str, container: nn.Module) -> BlockList:
    prefix = f"{name}." if name else ""
    children = list(container.named_children())
    return BlockList(
        container=name,
        names=tuple(prefix + child for child, _ in children),
        modules=tuple(m for _, m in children),
    )


def _suggest(model: nn.Module) -> str:
    names = [
        n or "(root)"
        for n, m in model.named_modules()
        if isinstance(m, nn.ModuleList | nn.Sequential)
    ]
    return ", ".join(names[:5]) or "none found"


def module_digest(model: nn.Module) -> str:
    """Digest of the parameter names and shapes (not dtypes: a model profiled in bf16 on the
    meta device and trained in fp32 is the same model); shared parameters count once."""
    rows = sorted(f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters())
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def same_structure(a: nn.Module, b: nn.Module) -> bool:
    """Whether two blocks are interchangeable for profiling: same class, same parameter and
    buffer names, shapes and dtypes (their costs are then equal)."""
    if type(a) is not type(b):
        return False

    def sig(m: nn.Module) -> list[tuple]:
        return [
            (n, tuple(t.shape), t.dtype) for n, t in [*m.named_parameters(), *m.named_buffers()]
        ]

    return sig(a) == sig(b)
