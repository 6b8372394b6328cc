"""Row-chunked matrix-free products ``F(x1, x2) @ rhs`` that recompute blocks in the backward pass.

Every kernel product in gpscale runs through :func:`chunked_product`, the one chunking helper
(STYLE §4 "Memory"). A :class:`ChunkRule` says how one row chunk ``x1[c]`` of the product is
computed (``forward``) and differentiated (``vjp``); :func:`autograd_rule` builds the rule for any
differentiable block function by recomputing the chunk under autograd.

Memory: the autograd function saves only its inputs ``x1, x2, rhs`` (no block of ``F``). The
forward pass and the backward pass each visit the row chunks one at a time, so at most one
``chunk_size × n2`` block (plus a few temporaries of the same size) exists at any moment; the
gradients of ``x2``, ``rhs`` and the parameters are accumulated over chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = [
    "DEFAULT_MAX_KERNEL_ENTRIES",
    "ChunkRule",
    "autograd_rule",
    "chunked_product",
    "default_chunk_size",
]

DEFAULT_MAX_KERNEL_ENTRIES = 2**22
"""Default budget of kernel entries per chunk (4,194,304: 32 MiB in float64, 16 MiB in float32)."""

Grads = tuple[Tensor | None, ...]


def default_chunk_size(num_cols: int, max_entries: int = DEFAULT_MAX_KERNEL_ENTRIES) -> int:
    """Rows per chunk so that a ``rows × num_cols`` block holds at most ``max_entries`` entries."""
    return max(1, max_entries // max(1, num_cols))


@dataclass(frozen=True)
class ChunkRule:
    """How one row chunk of ``F(x1, x2) @ rhs`` is computed and differentiated.

    Attributes:
        forward: ``(x1c, x2, rhs) -> out_c``, the product for the rows ``x1c`` (..., c, d); the
            output's second-to-last axis indexes those rows.
        vjp: ``(x1c, x2, rhs, grad_out_c, needs) -> grads``, the vector-Jacobian products for
            ``(x1c, x2, rhs, *params)``; ``needs`` flags which are wanted (others may be None).
        params: further tensors the block depends on (e.g. kernel hyperparameters).
    """

    forward: Callable[[Tensor, Tensor, Tensor], Tensor]
    vjp: Callable[[Tensor, Tensor, Tensor, Tensor, tuple[bool, ...]], Grads]
    params: tuple[Tensor, ...] = ()


def autograd_rule(fn: Callable[[Tensor, Tensor, Tensor], Tensor],
                  params: tuple[Tensor, ...] = ()) -> ChunkRule:
    """A rule whose backward pass recomputes ``fn`` on the chunk under autograd.

    Args:
        fn: ``(x1c, x2, rhs) -> out_c``, differentiable in its arguments and in ``params``.
        params: leaf tensors ``fn`` reads (e.g. ``kernel.parameters()``) that need gradients.
    """

    def vjp(x1c: Tensor, x2: Tensor, rhs: Tensor, grad_out: Tensor,
            needs: tuple[bool, ...]) -> Grads:
        with torch.enable_grad():
            inputs = zip((x1c, x2, rhs), needs[:3], strict=True)
            leaves = [t.detach().requires_grad_(need) for t, need in inputs]
            out = fn(*leaves)
            targets = [t for t, need in zip((*leaves, *params), needs, strict=True) if need]
            if not targets or not out.requires_grad:
                return (None,) * len(needs)
            found = iter(torch.autograd.grad(out, targets, grad_out, allow_unused=True))
        return tuple(next(found) if need else None for need in needs)

    return ChunkRule(forward=fn, vjp=vjp, params=tuple(params))


def chunked_product(rule: ChunkRule, x1: Tensor, x2: Tensor, rhs: Tensor, *,
                    chunk_size: int) -> Tensor:
    """``F(x1, x2) @ rhs`` computed ``chunk_size`` rows of ``x1`` at a time, forward and backward.

    Args:
        rule: the chunk computation and its vector-Jacobian product.
        x1: row inputs (..., n1, d).
        x2: column inputs (..., n2, d).
        rhs: right-hand sides (..., n2, k).
        chunk_size: rows of ``x1`` per chunk (≥ 1).

    Returns:
        The product (..., n1, k), differentiable in ``x1``, ``x2``, ``rhs`` and ``rule.params``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")
    return _ChunkedProduct.apply(rule, int(chunk_size), x1, x2, rhs, *rule.params)


def _accumulate(total: Tensor | None, part: Tensor | None) -> Tensor | None:
    if part is None:
        return total
    return part if total is None else total + part


class _ChunkedProduct(torch.autograd.Function):
    """Autograd function behind :func:`chunked_product` (saves inputs only, recomputes blocks)."""

    @staticmethod
    def forward(ctx, rule: ChunkRule, chunk_size: int, x1: Tensor, x2: Tensor, rhs: Tensor,
                *params: Tensor) -> Tensor:
        ctx.rule, ctx.chunk_size = rule, chunk_size
        ctx.save_for_backward(x1, x2, rhs)
        parts = [rule.forward(x1c, x2, rhs) for x1c in x1.split(chunk_size, dim=-2)]
        return torch.cat(parts, dim=-2)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x1, x2, rhs = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[2:])
        grad_x1: list[Tensor] = []
        totals: list[Tensor | None] = [None] * (len(needs) - 1)  # x2, rhs, *params
        chunks = zip(x1.split(ctx.chunk_size, dim=-2), grad_out.split(ctx.chunk_size, dim=-2),
                     strict=True)
        for x1c, grad_c in chunks:
            grads = ctx.rule.vjp(x1c, x2, rhs, grad_c, needs)
            if needs[0]:
                grad_x1.append(grads[0] if grads[0] is not None else torch.zeros_like(x1c))
            totals = [_accumulate(t, g) for t, g in zip(totals, grads[1:], strict=True)]
        return (None, None, torch.cat(grad_x1, dim=-2) if needs[0] else None, *totals)
