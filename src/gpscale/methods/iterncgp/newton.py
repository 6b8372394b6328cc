"""IterNCGP's Newton steps: the line search with a trust radius, and the factory's Newton options.

Alg. 1 takes full Newton steps f_{i+1} = m + K v_j. With truncated inner solves those can lower
Ψ or overshoot; :func:`newton_step_size` backtracks on Ψ from a step no longer than a trust
radius in latent units (beyond the paper; ``line_search=False`` gives Alg. 1).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from gpscale.methods.options import Option

__all__ = ["LINE_SEARCH_HALVINGS", "MAX_ITERATIONS", "MAX_STEP", "NEWTON_OPTIONS",
           "newton_step_size", "relative_change"]

MAX_ITERATIONS = 15
"""The factory's j_max (the paper's is 5, :class:`Stopping`'s default): with the trust radius,
j ≤ 15 takes far fewer damped Newton steps at a learned, large outputscale, and reaches the
same accuracy sooner (BENCHMARKS.md ``iterncgp``)."""
MAX_STEP = 4.0
"""The factory's trust radius (latent units): a Newton step of the line search moves no logit or
log-rate by more than this. Cold Newton at a large outputscale with j ≤ 15 otherwise saturates
thousands of points in its first step and stalls (gmm10, n = 20k, BENCHMARKS.md)."""
NEWTON_OPTIONS = (
    Option("max_iterations", "int", MAX_ITERATIONS, "IterGP iterations per Newton step "
           "(the paper: 5)", minimum=1),
    Option("max_newton_steps", "int", 100, "most Newton steps", minimum=1),
    Option("outer_rtol", "float", 0.01, "Newton stops at this relative change (0: run "
           "max_newton_steps)", minimum=0),
    Option("atol", "float", 1e-5, "inner solve absolute tolerance", minimum=0),
    Option("rtol", "float", 1e-5, "inner solve relative tolerance", minimum=0),
    Option("recycle", "bool", True, "recycle actions across Newton steps"),
    Option("compression_rank", "int", None, "compress recycled actions to this rank; "
           "none: no compression", minimum=1),
    Option("line_search", "bool", True, "backtracking line search on each Newton step"),
    Option("max_step", "float", MAX_STEP, "trust radius of a Newton step: the largest "
           "change of a latent value (logit, log-rate); none: unbounded", minimum=0,
           exclusive=True, allow_none=True),
)
"""The factory's options of the Newton and IterGP loops (:class:`Stopping`, :class:`Recycling`,
the line search)."""
LINE_SEARCH_HALVINGS = 10
"""The line search tries α = α₀, α₀/2, …, α₀ 2^{−10} before it rejects a Newton step."""


def newton_step_size(log_joint: Callable[[float], Tensor], largest_change: float,
                     max_step: float | None = None) -> float:
    """Backtracking step size along a Newton step Δf (a safeguard Alg. 1 does not have).

    Tries α = α₀ 2^{−h}, h = 0 … :data:`LINE_SEARCH_HALVINGS`, and returns the first with
    Ψ(f + α Δf) ≥ Ψ(f) (NaN counts as worse), else 0 (the step is rejected). α₀ = 1, or
    ``max_step`` / ‖Δf‖∞ when the full step would move some latent value by more than
    ``max_step`` (a trust radius in latent units: logits, log-rates). A truncated solve far from
    the mode can propose a step that raises Ψ yet saturates many points; the next Newton
    problem's W⁻¹ is then astronomically large on them and the solves stall (gmm10 at n = 20k,
    j ≤ 15, BENCHMARKS.md).

    Args:
        log_joint: α ↦ Ψ(f + α Δf).
        largest_change: ‖Δf‖∞.
        max_step: the trust radius, or ``None`` for none.
    """
    top = 1.0
    if max_step is not None and largest_change > max_step:
        top = max_step / largest_change
    current = log_joint(0.0)
    return next((top * 0.5**h for h in range(LINE_SEARCH_HALVINGS + 1)
                 if bool(log_joint(top * 0.5**h) >= current)), 0.0)


def relative_change(g_next: Tensor, g: Tensor) -> float:
    """‖g_{i+1} − g_i‖ / ‖g_{i+1}‖ (0 when both vanish)."""
    num, den = float((g_next - g).norm()), float(g_next.norm())
    if num == 0:
        return 0.0
    return num / den if den > 0 else float("inf")
