r"""IterGP with a virtual solver run: the inner loop of IterNCGP (Algs. 2 and 3 of Tatzel et al.).

One Newton step poses the regression problem :math:`\hat K v = b` with
:math:`\hat K = K + W^{-1}` and :math:`b = \hat y - m` (Prop. A.1). IterGP keeps a belief whose
precision approximation is :math:`C = Q Q^\top \approx \hat K^{-1}` and whose mean is the
representer-weight estimate v. Everything lives in the span of the buffered actions S, so the
belief stores coefficients only (float64):

    v = S a,    Q = S A,    K v = T a    (T = K S, the buffered kernel products).

Hence f_{i+1} − m = K v (Alg. 1, line 9) and the residual (Alg. 2, line 5) need no new product
with K; one inner iteration costs one K-product (Alg. 2, line 9) where the paper's box counts two,
and an outer step costs none where the box counts one. The arithmetic is the same.

Shapes: L latent functions, n points; vectors are (L, n), buffers (L, n, B).
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from gpscale.errors import ConvergenceWarning, NumericalError
from gpscale.linalg.ops import upcast
from gpscale.linalg.solvers.base import SolverStep

__all__ = [
    "Belief", "IterNCGPState", "IterativeResidualPolicy", "NewtonStep", "Recycling",
    "RegressionProblem", "Stopping",
    "empty_belief", "itergp", "residual", "solve", "virtual_solver_run",
]

Matmul = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Recycling:
    """Recycling of actions across Newton steps and its compression (Alg. 3, §3.3–3.4).

    Args:
        enabled: keep the actions S and T = K S across Newton steps (virtual solver run);
            ``False`` starts every Newton step from the prior belief (C_0 = 0).
        rank: compression rank R: keep the R largest eigenpairs of M = Sᵀ K̂ S; ``None`` keeps
            all (R = ∞). Buffers then hold at most R + j_max actions (more only while a step
            rejected by IterNCGP's line search is solved further).
        eig_rtol: eigenpairs of M with λ ≤ ``eig_rtol`` · λ_max are dropped as numerically
            dependent actions; ``None`` uses 100 · eps of the buffers' dtype.
    """

    enabled: bool = True
    rank: int | None = None
    eig_rtol: float | None = None

    def __post_init__(self):
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"the compression rank must be ≥ 0 (or None for no compression); "
                             f"got {self.rank}")
        if self.eig_rtol is not None and not 0 <= self.eig_rtol < 1:
            raise ValueError(f"eig_rtol must lie in [0, 1); got {self.eig_rtol}")


@dataclass(frozen=True)
class Stopping:
    """Stopping rules of the outer (Newton) and inner (IterGP) loops (paper §B.2).

    Args:
        outer_rtol: δ: stop when ‖g_{i+1} − g_i‖ / ‖g_{i+1}‖ ≤ δ, g = f − m.
        max_newton_steps: cap on the outer iterations.
        atol: δ_abs of the inner rule ‖r_j‖ < max(δ_abs, δ_rel ‖ŷ − m‖).
        rtol: δ_rel of the same rule.
        max_iterations: j_max, inner iterations per Newton step.
        eta_rtol: the inner loop stops when η_j ≤ ``eta_rtol`` · ``|s_jᵀ K̂ s_j|`` (η_j ≤ 0 in
            the paper; a relative floor catches actions that only round-off separates from
            span(S)); ``None`` uses 10 · eps of the working dtype.
    """

    outer_rtol: float = 0.01
    max_newton_steps: int = 100
    atol: float = 1e-5
    rtol: float = 1e-5
    max_iterations: int = 5
    eta_rtol: float | None = None

    def __post_init__(self):
        for name in ("outer_rtol", "atol", "rtol"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0; got {getattr(self, name)}")
        for name in ("max_newton_steps", "max_iterations"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer ≥ 1; got {getattr(self, name)!r}")
        if self.eta_rtol is not None and not 0 <= self.eta_rtol < 1:
            raise ValueError(f"eta_rtol must lie in [0, 1); got {self.eta_rtol}")


@dataclass(frozen=True)
class RegressionProblem:
    """One Newton step's GP regression problem K̂ v = b, K̂ = K + W⁻¹ (Prop. A.1).

    Attributes:
        b: (L, n) right-hand side ŷ(f_i) − m.
        K_matmul: V ↦ K V for V (L, n, k) (the prior covariance at the training inputs).
        W_inv_matmul: V ↦ W(f_i)⁻¹ V for V (L, n) or (L, n, k).
        W_matmul: V ↦ W(f_i) V (the likelihood's negative Hessian), for the preconditioned
            residual policy; None when not given.
    """

    b: Tensor
    K_matmul: Matmul
    W_inv_matmul: Matmul
    W_matmul: Matmul | None = None

    def K_hat_matmul_buffer(self, S: Tensor, T: Tensor) -> Tensor:
        """K̂ S = T + W⁻¹ S from the buffered T = K S (no product with K)."""
        return T + self.W_inv_matmul(S)


@dataclass(frozen=True)
class Belief:
    """IterGP belief after some iterations on one regression problem.

    Attributes:
        S: (L, n, B) actions (buffer).
        T: (L, n, B) K S (buffer).
        A: (B, B') float64 root coefficients: C = Q Qᵀ with Q = S A.
        a: (B,) float64 representer-weight coefficients: v = S a.
        residual: (L, n) r = b − K̂ v, or ``None`` before :func:`itergp` evaluated it.
        iteration: inner iterations j done on this problem.
        num_actions: actions taken so far (recycled ones included), the index the next
            unit-vector action uses.
        stopped: why the inner loop stopped (see :func:`itergp`), ``None`` while running.
        room: storage S and T may grow into without a copy (:class:`_Room`), or ``None``.
    """

    S: Tensor
    T: Tensor
    A: Tensor
    a: Tensor
    residual: Tensor | None = None
    iteration: int = 0
    num_actions: int = 0
    stopped: str | None = None
    room: _Room | None = field(default=None, repr=False, compare=False)

    @property
    def rank(self) -> int:
        """B, the number of buffered actions."""
        return self.S.shape[-1]

    @property
    def v(self) -> Tensor:
        """(L, n) representer weights v = S a."""
        return _span(self.S, self.a)

    @property
    def Q(self) -> Tensor:
        """(L, n, B') root of the precision approximation, C = Q Qᵀ."""
        return _span(self.S, self.A)

    @property
    def Kv(self) -> Tensor:
        """(L, n) K v = T a (Alg. 1, line 9 without a new K-product)."""
        return _span(self.T, self.a)


def _span(S: Tensor, coef: Tensor) -> Tensor:
    """S c for S (L, n, B) and c (B,) or (B, k)."""
    return torch.einsum("lnb,b...->ln...", S, coef.to(S.dtype))


def _project(S: Tensor, w: Tensor) -> Tensor:
    """Sᵀ w in float64 for w (L, n) or (L, n, k)."""
    return upcast(torch.einsum("lnb,ln...->b...", S, w))


def empty_belief(b: Tensor, num_actions: int = 0) -> Belief:
    """The prior belief C_0 = 0, v_0 = 0 (no recycling) for a right-hand side b (L, n)."""
    L, n = b.shape
    empty = b.new_zeros(L, n, 0)
    f64 = dict(dtype=torch.float64, device=b.device)
    return Belief(empty, empty, torch.zeros(0, 0, **f64), torch.zeros(0, **f64),
                  num_actions=num_actions)


def virtual_solver_run(previous: Belief, problem: RegressionProblem,
                       recycling: Recycling) -> Belief:
    """Alg. 3: C_0 = S M⁻¹ Sᵀ on the new problem from the buffers alone (zero K-products).

    M = Sᵀ(T + W⁻¹S) = Sᵀ K̂ S (line 2) = U Λ Uᵀ (line 3, descending); keep the R largest
    eigenpairs (lines 5–6) and those above ``eig_rtol`` · λ_max; rotate S ← S U, T ← T U
    (line 7); Q_0 = S Λ^{-1/2} (line 8); v_0 = C_0 b (Alg. 2, line 3).

    Args:
        previous: the belief whose buffers S, T are recycled.
        problem: the new regression problem (its W⁻¹ and b).
        recycling: rank R and eigenvalue floor.

    Returns:
        The initial belief of the new problem (iteration 0, residual not yet evaluated).
    """
    S, T = previous.S, previous.T
    if S.shape[-1] == 0 or recycling.rank == 0:
        return empty_belief(problem.b, previous.num_actions)
    M = _project(S, problem.K_hat_matmul_buffer(S, T))  # (B, B), line 2
    if not bool(torch.isfinite(M).all()):
        raise NumericalError(f"the recycled projection M = SᵀK̂S ({M.shape[0]}×{M.shape[0]}) is "
                             "not finite: the Newton iterates diverged or W⁻¹ overflowed; use "
                             "the line search, more inner iterations or float64")
    M = 0.5 * (M + M.mT)
    eigvals, U = torch.linalg.eigh(M)  # ascending
    eigvals, U = eigvals.flip(0), U.flip(1)  # line 4: λ_1 ≥ … ≥ λ_B
    rtol = recycling.eig_rtol if recycling.eig_rtol is not None else 100 * _eps(S)
    keep = int((eigvals > rtol * eigvals[0].clamp_min(0)).sum())
    if recycling.rank is not None:
        keep = min(keep, recycling.rank)  # line 6: compression to rank R
    eigvals, U = eigvals[:keep], U[:, :keep]
    S, T = _span(S, U), _span(T, U)  # line 7, (L, n, R)
    A = torch.diag(eigvals.rsqrt())  # line 8: Q_0 = S Λ^{-1/2}
    a = _project(S, problem.b) / eigvals  # Alg. 2 line 3: v_0 = S Λ⁻¹ Sᵀ b
    return Belief(S, T, A, a, num_actions=previous.num_actions)


def residual(problem: RegressionProblem, belief: Belief) -> Tensor:
    """Alg. 2, line 5: r = b − K v − W⁻¹ v with K v = T a (L, n)."""
    if belief.rank == 0:
        return problem.b.clone()
    return problem.b - belief.Kv - problem.W_inv_matmul(belief.v)


Policy = Callable[[SolverStep], "Tensor | None"]


def itergp(problem: RegressionProblem, belief: Belief, policy: Policy,
           stopping: Stopping) -> Iterator[Belief]:
    """Alg. 2, lines 4–16, from an initial belief (Alg. 3 or :func:`empty_belief`).

    Yields the belief after j = 0, 1, 2, … iterations, each once; the last one carries
    ``stopped``: ``"tolerance"`` (‖r_j‖ < max(δ_abs, δ_rel ‖b‖)), ``"max_iterations"`` (j_max),
    ``"full_rank"`` (B = nL actions), ``"policy"`` (no further or a zero action) or ``"eta"``
    (η_j ≤ floor: the action is discarded and the current belief returned).

    Args:
        problem: K̂ v = b.
        belief: the initial belief (C_0, v_0).
        policy: maps a :class:`SolverStep` (iteration = ``belief.num_actions``, solution v,
            residual r, both (L, n)) to the next action (L, n), or ``None``.
        stopping: tolerances, j_max and the η floor.
    """
    if hasattr(policy, "bind"):  # a policy that needs the problem (e.g. W for preconditioning)
        policy = policy.bind(problem)
    b = problem.b
    bound = max(stopping.atol, stopping.rtol * float(b.norm()))
    eta_rtol = stopping.eta_rtol if stopping.eta_rtol is not None else 10 * _eps(b)
    reason = None
    while True:
        r = residual(problem, belief)  # line 5
        r_norm = r.norm()
        belief = replace(belief, residual=r)
        if float(r_norm) < bound:
            reason = "tolerance"
        elif belief.iteration >= stopping.max_iterations:
            reason = "max_iterations"
        elif belief.rank >= r.numel():
            reason = "full_rank"
        if reason is not None:
            break
        previous = belief.S[..., -1] if belief.rank else torch.zeros_like(r)
        s = policy(SolverStep(belief.num_actions, belief.v, r, r_norm, previous, None,
                              torch.tensor(False)))  # line 6
        if s is None or not bool(s.norm() > 0):
            reason = "policy"
            break
        extended = _condition_on_action(problem, belief, s / s.norm(), r, eta_rtol)
        if extended is None:
            reason = "eta"
            break
        yield belief
        belief = extended
    yield replace(belief, stopped=reason)


def solve(problem: RegressionProblem, belief: Belief, policy: Policy,
          stopping: Stopping) -> Belief:
    """The final belief of :func:`itergp` (the intermediate ones are not kept)."""
    return deque(itergp(problem, belief, policy, stopping), maxlen=1)[0]


def _condition_on_action(problem: RegressionProblem, belief: Belief, s: Tensor, r: Tensor,
                         eta_rtol: float) -> Belief | None:
    """Alg. 2, lines 7–16 for the action s (L, n); ``None`` when η is at or below its floor."""
    t = problem.K_matmul(s[..., None])[..., 0]  # line 9: t_j = K s_j, (L, n)
    z = t + problem.W_inv_matmul(s)  # line 11: z_j = K̂ s_j
    w = belief.A.mT @ _project(belief.S, z)  # (B',): C_{j−1} z_j = S A w
    zs = upcast((z * s).sum())
    eta = zs - w @ w  # line 13: η_j = z_jᵀ d_j with d_j = s_j − S A w (line 12)
    if not bool(eta > eta_rtol * zs.abs()):
        return None
    alpha = upcast((s * r).sum())  # line 8: α_j = s_jᵀ r_{j−1}
    d = torch.cat([-(belief.A @ w), w.new_ones(1)])  # (B+1,) coefficients of d_j in (S, s_j)
    B, Bq = belief.A.shape
    A = belief.A.new_zeros(B + 1, Bq + 1)
    A[:B, :Bq] = belief.A
    A[:, Bq] = d / eta.sqrt()  # line 14: Q_j = (Q_{j−1}, d_j / √η_j)
    a = torch.cat([belief.a, belief.a.new_zeros(1)]) + (alpha / eta) * d  # line 16
    if torch.is_grad_enabled() and (s.requires_grad or t.requires_grad):  # no in-place writes
        return Belief(torch.cat([belief.S, s[..., None]], -1),
                      torch.cat([belief.T, t[..., None]], -1), A, a, None, belief.iteration + 1,
                      belief.num_actions + 1)
    room = _room_for(belief)
    room.S[..., B], room.T[..., B] = s, t  # lines 7 and 10: S_j = (S_{j−1}, s_j), T likewise
    room.used = B + 1
    return Belief(room.S[..., :B + 1], room.T[..., :B + 1], A, a, None, belief.iteration + 1,
                  belief.num_actions + 1, room=room)


@dataclass(eq=False)
class _Room:
    """Storage for a growing buffer pair: S and T are prefixes ``[..., :used]`` of these.

    Appending an action to a belief whose S, T are the whole used prefix writes one column in
    place (a view of the prefix stays valid: nothing before ``used`` changes); any other belief
    (an earlier one, or one made elsewhere) gets a new room and one copy. A buffer of B columns
    then costs O(L n) per action instead of a copy of all B."""

    S: Tensor
    T: Tensor
    used: int


def _room_for(belief: Belief) -> _Room:
    """A room whose column ``belief.rank`` may be written: the belief's own if its S, T are the
    room's whole used prefix and it has space, else a new one holding a copy of S, T."""
    room, B = belief.room, belief.rank
    if (room is not None and room.used == B and room.S.shape[-1] > B
            and belief.S.data_ptr() == room.S.data_ptr()
            and belief.T.data_ptr() == room.T.data_ptr()):
        return room
    L, n = belief.S.shape[:2]
    capacity = B + max(16, B // 2)
    room = _Room(belief.S.new_empty(L, n, capacity), belief.T.new_empty(L, n, capacity), B)
    room.S[..., :B], room.T[..., :B] = belief.S, belief.T
    return room


@dataclass(frozen=True)
class IterativeResidualPolicy:
    """CG policy: the next action is the current residual, s_j = r_{j−1} (IterNCGP-CG, §3.2).

    With C_0 = 0 the iterates v_j equal those of conjugate gradients started at 0.
    """

    def __call__(self, step: SolverStep) -> Tensor:
        return step.residual


@dataclass(frozen=True)
class PreconditionedResidualPolicy:
    """Preconditioned CG policy: s_j = W r_{j−1}, i.e. P⁻¹ r with P = W⁻¹ (beyond the paper).

    IterGP with actions P⁻¹r_{j−1} runs preconditioned CG (its actions span the Krylov space of
    P⁻¹K̂ = I + W K): with saturated probabilities W⁻¹ in K̂ = K + W⁻¹ is huge on the confident
    points, so the plain residual, and hence the CG action, is dominated by them; scaling by W
    takes that weight away. On MNIST with one iteration per Newton step the plain residual
    policy's Newton steps stall after a few (every later step fails the line search), the
    preconditioned ones converge. Softmax: W's null direction (the class sum) is never explored.
    """

    def bind(self, problem: RegressionProblem) -> Policy:
        """The policy for one Newton step's problem (needs ``problem.W_matmul``)."""
        if problem.W_matmul is None:
            raise ValueError("the preconditioned CG policy needs the problem's W_matmul")
        W = problem.W_matmul
        return lambda step: W(step.residual)

    def __call__(self, step: SolverStep) -> Tensor:
        raise TypeError("PreconditionedResidualPolicy needs the regression problem: bind() it")


def _eps(t: Tensor) -> float:
    return float(torch.finfo(t.dtype).eps)


@dataclass(frozen=True)
class NewtonStep:
    """What one outer iteration did (for monitoring and tests).

    Attributes:
        step: i (0-based).
        iterations: inner iterations j run on this step's problem.
        stopped: why the inner loop stopped (see :func:`~gpscale.methods.iterncgp.solver.itergp`).
        residual_norm: ‖r_j‖ at the end of the inner loop.
        relative_change: ‖g_{i+1} − g_i‖ / ‖g_{i+1}‖, g = f − m (outer criterion, §B.2).
        buffer_size: B after the step (recycled plus new actions).
        step_size: α of the line search (1: the full step of Alg. 1; 0: rejected).
        log_joint: Ψ(f_{i+1}) up to a constant (Eq. 2), at the accepted iterate.
    """

    step: int
    iterations: int
    stopped: str
    residual_norm: float
    relative_change: float
    buffer_size: int
    step_size: float = 1.0
    log_joint: float = float("nan")


@dataclass(frozen=True)
class IterNCGPState:
    """Everything IterNCGP computed from the data.

    Attributes:
        x: (n, d) training inputs.  y: (n,) targets.
        f: (L, n) final Newton iterate f = m + K v (the approximate mode).
        v: (L, n) representer weights v_j of the last regression problem.
        Q: (L, n, B') root of C_j = Q Qᵀ ≈ K̂(f_i)⁻¹.
        S: (L, n, B) buffered actions.  T: (L, n, B) K S.
        trace: one :class:`NewtonStep` per outer iteration.
        converged: the outer criterion was met (else ``max_newton_steps`` ran out).
    """

    x: Tensor
    y: Tensor
    f: Tensor
    v: Tensor
    Q: Tensor
    S: Tensor
    T: Tensor
    trace: tuple[NewtonStep, ...]
    converged: bool

    def __post_init__(self):  # buffers that are prefixes of a larger room: their own storage
        for name in ("S", "T"):
            object.__setattr__(self, name, getattr(self, name).contiguous())


def warn_unconverged(state: IterNCGPState, outer_rtol: float) -> None:
    """Warn (:class:`~gpscale.errors.ConvergenceWarning`) when ``state``'s outer iterations ran
    out before the mean's relative change fell to ``outer_rtol`` (0: all steps were asked for);
    the message names the last change and the steps taken. The state is still the best iterate
    reached (its Newton steps never lower Ψ, its variational steps never lower the ELBO)."""
    if state.converged or outer_rtol <= 0 or not state.trace:
        return
    moved = [step.relative_change for step in state.trace if step.step_size > 0] or [math.nan]
    stalled = state.trace[-1].step_size == 0  # no step size raised Ψ, the solve cannot improve
    warnings.warn(f"IterNCGP's posterior mean still changed by {moved[-1]:.3g} (relative) in "
                  f"its last {'accepted ' if stalled else ''}step, above outer_rtol = "
                  f"{outer_rtol:g}, after {len(state.trace)} "
                  "Newton/variational steps; the last iterate is used (raise max_newton_steps "
                  "or vi_steps for a converged mean)", ConvergenceWarning, stacklevel=3)
