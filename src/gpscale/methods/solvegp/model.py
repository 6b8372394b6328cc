r"""``solvegp``: SOLVE-GP, sparse orthogonal variational inference (regression, classification).

Shi, Titsias & Mnih (2020), "Sparse Orthogonal Variational Inference for Gaussian Processes",
AISTATS 2020, arXiv:1910.10596 (notes/004_solvegp.md; equation numbers are the paper's).

==========  ===============================  ================================================
symbol      variable                         meaning
==========  ===============================  ================================================
x, y        ``state.x``, ``state.y``         (b, d) inputs (a minibatch), (b,) targets
N           ``num_data``                     training-set size, scales the KL terms
L           ``num_latents``                  latent GPs: 1 (regression, binary), C (softmax)
Z, u        ``inducing_points``              (L, M, d) standard inducing inputs, u = f(Z)
O, v⊥       ``orthogonal_points``            (L, M2, d) orthogonal inducing inputs, v⊥ = f⊥(O)
L_u⁰, L_v⁰  ``chol_uu``, ``chol_vv``         chol(K_uu), chol(C_vv) (float64)
A           ``InducingFactors.A``            L_u⁰ \ K_uv (M, M2)
B, D        ``Projections.B``, ``.D``        L_u⁰ \ K_uf (M, b), L_v⁰ \ C_vf (M2, b)
q(u)        ``q_mean_u``, ``q_chol_u``       N(m_u, L_u L_uᵀ) (whitened: of u' = L_u⁰⁻¹ u)
q(v⊥)       ``q_mean_v``, ``q_chol_v``       N(m_v, L_v L_vᵀ) (whitened: of L_v⁰⁻¹ v⊥)
σ²          ``noise``                        Gaussian noise variance (regression)
==========  ===============================  ================================================

Model (notes §2.3–2.4). f = f∥ + f⊥ with f∥(x) = k(x, Z) K_uu⁻¹ u and the residual GP f⊥ with
covariance c(x, x') = k(x, x') − k(x, Z) K_uu⁻¹ k(Z, x'); C_vv = c(O, O), C_vf = c(O, X).
Variational family q(u) q(v⊥) p⊥(f⊥ | v⊥), plus GPyTorch's learned constant prior mean μ₀.

Implemented:

- ELBO, Eq. (8) = (31): Σ_n E_{N(μ_n, σ_n²)}[log p(y_n | f_n)] − KL_u − KL_v with the marginals
  (33)–(34) and the KLs (35)–(36) (with M2 in (36), notes §5 typo 1) by Alg. 1: two Cholesky
  factorisations, of K_uu (M × M) and C_vv = K_vv − AᵀA (M2 × M2), never one of size M + M2.
  ``loss`` = (KL_u + KL_v)/N − mean over the batch of the expected log-likelihoods: an
  unbiased minibatch estimate of −ELBO/N.
- Whitened (default, ``whiten=True``) and unwhitened q. Both run through the whitened formulas
  of notes §2.14 (μ = Bᵀa_u + Dᵀa_v, σ² = k(x, x) + ‖P_uᵀB‖² − ‖B‖² + ‖P_vᵀD‖² − ‖D‖²): for an
  unwhitened q, a = L⁰⁻¹m and P = L⁰⁻¹L are exactly Compute_KL's quantities (Alg. 1 line 9), and
  Eᵀm_u = Bᵀa_u, F = L_uᵀE = P_uᵀB (lines 5–7), likewise G, H.
- ``objective='collapsed'`` (Gaussian regression, full batch): Eq. (9) at the optimal q(v⊥) of
  Eqs. (28)–(29), i.e. Eq. (30), in O(n (M + M2)² + M³ + M2³) by Woodbury (:func:`collapsed_bound`,
  :func:`optimal_q_v`). Prediction then uses q*(v⊥) and the optimal q(u) given it (derived in notes
  §2.7: whitened S_u = Λ⁻¹, m_u = Λ⁻¹B(y − μ₀ − Dᵀa_v)/σ², Λ = I + BBᵀ/σ²), so it needs the data.
- Predictive, Eqs. (37)–(38) marginals (= (33)–(34) at test inputs); σ² added for regression.
  ``optimal_q``: regression sets q and σ² to it after training (:mod:`.solvegp.optimal`).
- Special cases by arguments: ``num_orthogonal=0`` is SVGP (Hensman et al. 2013/2015);
  ``orthogonal_q='mean'`` fixes S_v = C_vv (whitened L_v = I) and learns m_v only: ODVGP
  (Salimbeni et al. 2018, notes §2.10), without its K_vv column subsampling.

Likelihoods (:mod:`.solvegp.likelihoods`): Gaussian; binary labels: logistic Bernoulli, one
latent GP; C > 2 classes: C latent GPs (own kernel, Z and O, as ``svgp``) and the softmax by
Monte Carlo (prediction's draws seeded with ``seed``) or robust-max. Initialisation: k-means with
M + M2 centres on (a seeded subsample of) the inputs, randomly split into Z (M) and O (M2), so
that no o_i sits on a z_j (C_vv would be singular there, notes §5); q(u), q(v⊥) start at the
prior (whitened: N(0, I); unwhitened: L_u = L_u⁰, L_v = L_v⁰). Numerics and speed (one minibatch
step in float32; notes §2.11): K(Z ∪ O, Z ∪ O) is one kernel call, upcast to float64; K_uu, C_vv,
their Cholesky factors, A and the inverse factors (L_u⁰)⁻¹, (L_v⁰)⁻¹ are float64
(:func:`cholesky_and_inverse`, whose backward needs products only). The batch-sized work is in the
data dtype: K(x, Z ∪ O) is one kernel call (one fused autograd node for the stationary profiles of
:mod:`gpscale.linalg.fused`, :func:`kernel_matrix_fused`), and the two triangular solves of Alg. 1
line 4 are products with the inverse factors cast to that dtype, B = (L_u⁰)⁻¹K_uf, D =
(L_v⁰)⁻¹(K_vf − AᵀB), with rounding errors of order ε‖(L⁰)⁻¹‖‖k(·, x)‖ like a float32 triangular
solve's. B and D stay whitened (‖b_j‖² + ‖d_j‖² ≤ k(x_j, x_j)); the variance is never formed from
K_uu⁻¹-scaled terms (k_uᵀK_uu⁻¹(S − K_uu)K_uu⁻¹k_u), which would square that. The variance terms
are the quadratic forms b_jᵀ(P_uP_uᵀ − I)b_j + d_jᵀ(P_vP_vᵀ − I)d_j (:func:`mean_and_quadratic`,
one product forward and one backward per set). The collapsed objective computes B, D in float64.
``jitter`` (1e-4 in float32, 1e-6 in float64 by default, as GPyTorch) is added to K_uu and C_vv;
``safe_cholesky`` adds more, with a warning, if needed. σ²(x) is a difference of terms, clamped at
0 (notes §5). Cost per step: O(b (M² + M M2 + M2²) + M³ + M2³ + M M2²) time, O(b (M + M2) + M² +
M2²) memory, times L. Deviation: the paper trains with no prior mean; we learn a constant mean like
the GPyTorch baselines.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from torch import Tensor, nn

from gpscale.distributions import Predictive
from gpscale.kernels import kernel_diag
from gpscale.likelihoods import Bernoulli, Softmax
from gpscale.linalg.ops import add_jitter, upcast
from gpscale.methods._common import (
    check_task_and_init,
    default_size,
    follow_init,
    gaussian_likelihood,
    prior_modules,
    prior_options,
    resolve_num_classes,
)
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.solvegp.likelihoods import expected_log_lik, predictive
from gpscale.methods.solvegp.optimal import finalize_regression
from gpscale.methods.solvegp.parts import (
    OBJECTIVES,
    ORTHOGONAL_Q,
    InducingFactors,
    Projections,
    SolveGPState,
    WhitenedQ,
    batch_eye,
    check_choice,
    check_sizes,
    cholesky_and_inverse,
    collapsed_bound,
    excess,
    gauss_hermite,
    gram,
    initial_points,
    kernel_matrix_fused,
    kl_whitened,
    mean_and_quadratic,
    optimal_q_u,
    optimal_q_v,
)
from gpscale.validation import check_x, check_xy

__all__ = ["OBJECTIVES", "ORTHOGONAL_Q", "InducingFactors", "Projections", "SolveGP",
           "SolveGPState", "WhitenedQ", "build_solvegp", "collapsed_bound", "gauss_hermite",
           "kl_whitened", "optimal_q_u", "optimal_q_v"]

TASKS = ("regression", "classification")
DEFAULT_JITTER = {torch.float32: 1e-4, torch.float64: 1e-6}


class SolveGP(Method):
    """SOLVE-GP with M standard and M2 orthogonal inducing points (key ``solvegp``).

    Args:
        mean: GPyTorch constant mean (batch shape (C,) for C > 2 classes).
        kernel: GPyTorch kernel (same batch shape).
        likelihood: GPyTorch ``GaussianLikelihood`` (regression), gpscale ``Bernoulli`` or
            ``Softmax``.
        inducing_points: Z (L, M, d).
        orthogonal_points: O (L, M2, d); M2 = 0 gives SVGP.
        task: ``"regression"`` or ``"classification"``.
        num_classes: C for classification, else ``None``.
        num_dims: input dimension d.
        num_latents: latent GPs L (one q(u), q(v⊥) each); ``None``: one per inducing set.
            With one set (batch 1) and L > 1 the latent GPs share the inducing inputs and the
            kernel (a multi-output model whose outputs differ only in q).
        num_data: N, scales the KL terms.
        objective: ``'elbo'`` (Eq. 8, minibatch) or ``'collapsed'`` (Eq. 30, full batch).
        whiten: whitened (default) or unwhitened parameterisation of q.
        orthogonal_q: ``'full'`` (SOLVE-GP) or ``'mean'`` (S_v = C_vv: ODVGP).
        jitter: added to K_uu and C_vv; ``None`` for :data:`DEFAULT_JITTER` of the dtype.
        num_quadrature: Gauss–Hermite nodes (binary likelihood).
        num_likelihood_samples: Monte Carlo draws (softmax likelihood).
        seed: seeds the Monte Carlo softmax probabilities at prediction.
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.methods.solvegp import build_solvegp
        >>> x = torch.randn(60, 2, dtype=torch.float64); y = torch.sin(x[:, 0])
        >>> model = build_solvegp(2, init=(x, y), num_inducing=6, num_orthogonal=6)
        >>> model.predict(model.condition(x, y), x[:3]).mean.shape
        torch.Size([3])
    """

    key = "solvegp"
    minibatch = True
    needs_data_for_prediction = False

    def __init__(self, mean: gpytorch.means.ConstantMean, kernel: gpytorch.kernels.Kernel,
                 likelihood: Any, inducing_points: Tensor, orthogonal_points: Tensor, *,
                 task: str, num_classes: int | None, num_dims: int, num_data: int,
                 objective: str = "elbo", whiten: bool = True, orthogonal_q: str = "full",
                 jitter: float | None = None, num_quadrature: int = 20,
                 num_likelihood_samples: int = 32, seed: int = 0,
                 num_latents: int | None = None, options: dict[str, Any] | None = None):
        super().__init__(task=task, num_classes=num_classes, options=options)
        check_choice("objective", objective, OBJECTIVES)
        check_choice("orthogonal_q", orthogonal_q, ORTHOGONAL_Q)
        if objective == "collapsed":
            if task != "regression":
                raise ValueError("objective='collapsed' needs the Gaussian likelihood "
                                 "(task='regression'); use objective='elbo' for classification")
            self.minibatch = False  # the collapsed bound is not a sum over data points
            self.needs_data_for_prediction = True  # q*(u), q*(v⊥) are computed from the data
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.num_dims, self.num_data, self.seed = num_dims, num_data, seed
        self.objective, self.whiten, self.orthogonal_q = objective, whiten, orthogonal_q
        self.jitter, self.num_quadrature = jitter, num_quadrature
        self.num_likelihood_samples = num_likelihood_samples
        sets, M, _ = inducing_points.shape
        num_latents = sets if num_latents is None else int(num_latents)
        if sets not in (1, num_latents):
            raise ValueError(f"{sets} inducing sets for {num_latents} latent GPs: give one set "
                             "per latent GP or one shared by all")
        self.num_latents = num_latents
        M2 = orthogonal_points.shape[1]
        self.inducing_points = nn.Parameter(inducing_points)
        self.orthogonal_points = nn.Parameter(orthogonal_points)
        like = inducing_points
        self.q_mean_u = nn.Parameter(like.new_zeros(num_latents, M))
        self.q_chol_u = nn.Parameter(batch_eye(num_latents, M, like))
        self.q_mean_v = nn.Parameter(like.new_zeros(num_latents, M2))
        self.q_chol_v = (nn.Parameter(batch_eye(num_latents, M2, like)) if orthogonal_q == "full"
                         else None)

    # -- Alg. 1 ---------------------------------------------------------------------------------
    def factors(self) -> InducingFactors:
        """Alg. 1 lines 1–2 in float64: L_u⁰, A = L_u⁰ \\ K_uv, L_v⁰ = chol(K_vv − AᵀA), and the
        inverse factors (L_u⁰)⁻¹, (L_v⁰)⁻¹ used by :meth:`projections`. K(Z ∪ O, Z ∪ O) is one
        kernel call. Cost O(M³ + M2³ + M M2²)."""
        z, o = self.inducing_points, self.orthogonal_points
        M, M2 = z.shape[-2], o.shape[-2]
        jitter = self._jitter()
        w = torch.cat([z, o], -2)  # (L, M + M2, d)
        # split, not slicing: the backward of a split is one concatenation, that of a slice a
        # zero-filled full-size gradient per block
        K_u, K_v = upcast(self.inducing_covariance(w)).split([M, M2], -2)
        K_uu, K_uv = K_u.split([M, M2], -1)
        K_vv = K_v.split([M, M2], -1)[1]
        chol_uu, inv_uu = cholesky_and_inverse(add_jitter(K_uu, jitter), name="SOLVE-GP K_uu")
        A = inv_uu @ K_uv  # (L, M, M2)
        C_vv = K_vv - gram(A.mT)  # (L, M2, M2)
        C_vv = 0.5 * (C_vv + C_vv.mT)
        chol_vv, inv_vv = cholesky_and_inverse(
            add_jitter(C_vv, jitter),
            name="SOLVE-GP residual covariance C_vv (orthogonal points too close to Z or to "
                 "each other; raise jitter or use fewer orthogonal points)")
        return InducingFactors(chol_uu, A, chol_vv, inv_uu, inv_vv)

    def projections(self, factors: InducingFactors, x: Tensor,
                    dtype: torch.dtype | None = None) -> Projections:
        """Alg. 1 lines 3–4 at ``x`` (b, d): B = L_u⁰ \\ K_uf, D = L_v⁰ \\ (K_vf − AᵀB), k(x, x).

        The two solves are products with the float64 inverse factors, cast to ``dtype``
        (default ``x.dtype``): O(b (M² + 2 M M2 + M2²)) in matrix products, in the training
        dtype, instead of batch-sized triangular solves in float64. K(x, Z ∪ O) is one kernel
        call.
        """
        dt = x.dtype if dtype is None else dtype
        M = self.inducing_points.shape[-2]
        w = torch.cat([self.inducing_points, self.orthogonal_points], -2)  # (L, M + M2, d)
        K_uf, K_vf = self.cross_covariance(w, x).to(dt).split(
            [M, self.orthogonal_points.shape[-2]], -2)
        B = factors.inv_uu.to(dt) @ K_uf  # (L, M, b)
        C_vf = torch.baddbmm(K_vf, factors.A.to(dt).mT, B, alpha=-1)  # K_vf − AᵀB
        D = factors.inv_vv.to(dt) @ C_vf  # (L, M2, b)
        return Projections(B, D, self.prior_variance(x).to(dt))

    # -- the covariances: inducing points here, inter-domain features in subclasses ---------------
    def inducing_covariance(self, w: Tensor) -> Tensor:
        """Cov[g(w_i), g(w_j)] (L, m, m) of the inducing variables at ``w`` (L, m, ·): here
        k(w, w) of the GP itself (inducing points). A subclass whose inducing variables live in
        another domain (patches of a convolutional kernel) overrides the three covariances."""
        return kernel_matrix_fused(self.kernel, w, w)

    def cross_covariance(self, w: Tensor, x: Tensor) -> Tensor:
        """Cov[g(w_i), f(x_j)] (L, m, b) between the inducing variables at ``w`` and f at the
        inputs ``x`` (b, d): here k(w, x)."""
        xb = x.expand(w.shape[0], *x.shape)  # (L, b, d), no copy
        return kernel_matrix_fused(self.kernel, w, xb)

    def prior_variance(self, x: Tensor) -> Tensor:
        """Var[f(x_j)] (L, b) under the prior: here k(x, x)."""
        return kernel_diag(self.kernel, x.expand(self.inducing_points.shape[0], *x.shape))

    def variational(self, factors: InducingFactors) -> WhitenedQ:
        """The module's q(u), q(v⊥) in whitened coordinates (float64).

        Unwhitened parameters (m, L) map to a = L⁰⁻¹m, P = L⁰⁻¹L (Alg. 1 line 9).
        """
        m_u, L_u = upcast(self.q_mean_u), torch.tril(upcast(self.q_chol_u))
        m_v = upcast(self.q_mean_v)
        L_v = (torch.tril(upcast(self.q_chol_v)) if self.q_chol_v is not None
               else batch_eye(m_v.shape[0], m_v.shape[1], m_v))
        if not self.whiten:
            m_u = (factors.inv_uu @ m_u[..., None])[..., 0]
            L_u = factors.inv_uu @ L_u
            m_v = (factors.inv_vv @ m_v[..., None])[..., 0]
            if self.q_chol_v is not None:  # else 'mean' (ODVGP): S_v = C_vv, whitened L_v = I
                L_v = factors.inv_vv @ L_v
        return WhitenedQ(m_u, L_u, m_v, L_v)

    def marginals(self, q: WhitenedQ, proj: Projections) -> tuple[Tensor, Tensor]:
        """Alg. 1 lines 5–7 (Eqs. 33–34): μ(x) = μ₀ + Bᵀa_u + Dᵀa_v and
        σ²(x) = k(x, x) + ‖P_uᵀB‖² − ‖B‖² + ‖P_vᵀD‖² − ‖D‖² (column sums), each (L, b).

        The variance terms are evaluated as the quadratic forms b_jᵀ(P_uP_uᵀ − I)b_j and
        d_jᵀ(P_vP_vᵀ − I)d_j (:func:`mean_and_quadratic`, in B's dtype), one O(b M²) product each
        way. With ``orthogonal_q='mean'`` the v-term is 0.
        """
        B, D = proj.B, proj.D
        if B.shape[0] != self.num_latents:  # one inducing set shared by the latent GPs
            B = B.expand(self.num_latents, *B.shape[1:])
            D = D.expand(self.num_latents, *D.shape[1:])
        dt = B.dtype
        mean, var = mean_and_quadratic(q.mean_u.to(dt), excess(q.chol_u, dt), B)  # Bᵀa_u, ...
        var = var + proj.prior_var
        if D.shape[-2] > 0:
            # 'mean' (ODVGP) trains with whitened S_v = I, where ‖P_vᵀD‖² − ‖D‖² = 0.
            if self.objective == "collapsed" or self.q_chol_v is not None:
                mean_v, var_v = mean_and_quadratic(q.mean_v.to(dt), excess(q.chol_v, dt), D)
                var = var + var_v
            else:
                mean_v = (q.mean_v.to(dt)[..., None, :] @ D)[..., 0, :]
            mean = mean + mean_v
        return mean + self.mean.constant.reshape(-1, 1), var.clamp_min(0.0)

    # -- Method contract --------------------------------------------------------------------------
    def condition(self, x: Tensor, y: Tensor) -> SolveGPState:
        """The validated batch, the inducing factors and q (the optimal q for ``collapsed``)."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y, task=self.task, num_classes=self.num_classes)
        labels = self.task == "classification" and self.num_latents > 1  # class indices
        y = y.long() if labels else y.to(x.dtype)
        factors = self.factors()
        if self.objective == "elbo":
            return SolveGPState(x, y, factors, self.variational(factors))
        proj = self.projections(factors, x, dtype=torch.float64)
        r = y - self.mean.constant.reshape(())
        mean_v, chol_v = optimal_q_v(proj, r, self.noise)
        mean_u, chol_u = optimal_q_u(proj, r, self.noise, mean_v)
        q = WhitenedQ(mean_u, chol_u, mean_v, chol_v)
        return SolveGPState(x, y, factors, q, collapsed_bound(proj, r, self.noise, mean_v, chol_v))

    def expected_log_lik(self, state: SolveGPState,
                         generator: torch.Generator | None = None) -> Tensor:
        """Batch mean of E_{N(μ_n, σ_n²)}[log p(y_n | f_n)] (Alg. 1 line 8)."""
        mean, var = self.marginals(state.q, self.projections(state.factors, state.x))
        return self._ell(mean, var, state.y, generator).mean()

    def kl(self, state: SolveGPState) -> Tensor:
        """(KL_u + KL_v)/N, Eqs. (35)–(36) by Alg. 1 line 9, summed over latent GPs (float64)."""
        q = state.q
        return (kl_whitened(q.mean_u, q.chol_u) + kl_whitened(q.mean_v, q.chol_v)).sum() \
            / self.num_data

    def loss(self, state: SolveGPState, generator: torch.Generator | None = None) -> Tensor:
        """``elbo``: kl − expected_log_lik (−Eq. 8 / N, unbiased on minibatches);
        ``collapsed``: −Eq. (30) / n on the full data."""
        if self.objective == "elbo":
            return self.kl(state).to(state.x.dtype) - self.expected_log_lik(state, generator)
        n = state.x.shape[0]
        if n != self.num_data:
            raise ValueError(f"objective='collapsed' is a full-batch bound over the {self.num_data}"
                             f" training points, got a batch of {n}: train with a batch size of"
                             " at least n (full batch) or use objective='elbo'")
        return (-state.bound / n).to(state.x.dtype)

    def predict(self, state: SolveGPState | None, x_test: Tensor,
                chunk_size: int = 4096) -> Predictive:
        """Marginals at ``x_test`` (t, d), Eqs. (37)–(38); ``state=None``: the module's q (elbo)."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        if state is None:
            if self.objective == "collapsed":
                raise ValueError("objective='collapsed' predicts from condition(x_train, y_train)"
                                 "; pass that state")
            factors = self.factors()
            q = self.variational(factors)
        else:
            factors, q = state.factors, state.q
        eps = torch.randn((self.num_likelihood_samples, self.num_latents, 1),
                          generator=torch.Generator().manual_seed(self.seed),
                          dtype=x_test.dtype).to(x_test.device)  # the same for every point

        def chunk(xc: Tensor) -> Predictive:
            mean, var = self.marginals(q, self.projections(factors, xc))
            return self._predictive(mean, var, eps)

        return predict_in_chunks(chunk, x_test, chunk_size)

    def finalize(self, x: Tensor, y: Tensor, reduce: Any = None, held: Any = None) -> Any:
        """Regression with ``optimal_q``: q and σ² at the ELBO's optimum (one data pass)."""
        return finalize_regression(self, x, y, reduce)

    def reset_variational(self) -> None:
        """Set q(u), q(v⊥) to the prior: m = 0, L = I (whitened) or L⁰ (unwhitened)."""
        with torch.no_grad():
            self.q_mean_u.zero_()
            self.q_mean_v.zero_()
            chols = [self.q_chol_u] + ([self.q_chol_v] if self.q_chol_v is not None else [])
            if self.whiten:
                for p in chols:
                    p.copy_(batch_eye(p.shape[0], p.shape[1], p))
            else:
                factors = self.factors()  # zip stops early without q_chol_v ('mean')
                for p, L0 in zip(chols, (factors.chol_uu, factors.chol_vv), strict=False):
                    p.copy_(L0)

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def noise(self) -> Tensor:
        """σ² (scalar) of the Gaussian likelihood."""
        return self.likelihood.noise.reshape(())

    def _jitter(self) -> float:
        if self.jitter is not None:
            return float(self.jitter)
        return DEFAULT_JITTER.get(self.inducing_points.dtype, DEFAULT_JITTER[torch.float32])

    def _ell(self, mean: Tensor, var: Tensor, y: Tensor,
             generator: torch.Generator | None) -> Tensor:
        """E_{N(mean, var)}[log p(y | f)] per data point (b,); mean, var (L, b)."""
        return expected_log_lik(self.likelihood, mean, var, y,
                                noise=self.noise if self.task == "regression" else None,
                                num_quadrature=self.num_quadrature,
                                num_samples=self.num_likelihood_samples, generator=generator)

    def _predictive(self, mean: Tensor, var: Tensor, eps: Tensor) -> Predictive:
        return predictive(self.likelihood, mean, var,
                          noise=self.noise if self.task == "regression" else None,
                          num_quadrature=self.num_quadrature, eps=eps)


def build_solvegp(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
                  init: tuple[Tensor, Tensor] | None = None, num_inducing: int | None = None,
                  num_orthogonal: int | None = None, objective: str = "elbo", whiten: bool = True,
                  orthogonal_q: str = "full", seed: int = 0, kmeans_max_points: int = 10_000,
                  num_data: int | None = None, jitter: float | None = None,
                  num_quadrature: int = 20, num_likelihood_samples: int = 32,
                  optimal_q: bool = True, **prior: Any) -> SolveGP:
    """Factory of ``solvegp`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: ``"regression"`` or ``"classification"``.
        num_classes: C; inferred from ``init`` labels (max + 1, at least 2) when ``None``.
        init: ``(x, y)``: k-means inducing points, N = len(y), data-dependent prior defaults;
            ``None`` allocates placeholders to be overwritten by ``load_state_dict``.
        num_inducing: M, standard inducing points (per latent GP).
        num_orthogonal: M2, orthogonal inducing points (0: SVGP).
        objective: ``'elbo'`` (minibatch, any likelihood) or ``'collapsed'`` (full batch,
            regression; train with a batch size ≥ n).
        whiten: whitened (default) or unwhitened q(u), q(v⊥).
        orthogonal_q: ``'full'`` (SOLVE-GP) or ``'mean'`` (S_v = C_vv, ODVGP).
        seed: seeds k-means, its subsample, the Z/O split and the softmax probabilities.
        kmeans_max_points: k-means runs on at most this many (randomly chosen) rows of x.
        num_data: N (``None``: that of ``init``). num_quadrature: binary likelihood's nodes.
        jitter: added to K_uu and C_vv (``None``: 1e-4 in float32, 1e-6 in float64).
        num_likelihood_samples: Monte Carlo draws for the softmax likelihood.
        optimal_q: regression: :meth:`SolveGP.finalize` sets q and σ² to the optimum.
        **prior: ``kernel`` (default matern32), ``ard``, ``lengthscale``, ``outputscale``,
            ``noise`` (regression), ``mean_constant``
            (:func:`~gpscale.methods._common.prior_options`).

    Raises:
        ValueError: unsupported task or objective, invalid ``init``, fewer points than
            M + M2, invalid counts, missing ``num_data`` or ``num_classes``.
    """
    check_task_and_init("solvegp", task, TASKS, num_dims, init, num_classes)
    n_init = None if init is None else init[0].shape[0]
    num_inducing = default_size(num_inducing, n_init, 256, 4, "num_inducing")
    num_orthogonal = default_size(num_orthogonal, n_init, 256, 4, "num_orthogonal")
    check_sizes(init, num_inducing=num_inducing, num_orthogonal=num_orthogonal,
                num_quadrature=num_quadrature, num_likelihood_samples=num_likelihood_samples,
                jitter=jitter, kmeans_max_points=kmeans_max_points)
    num_classes = resolve_num_classes(task, num_classes, init)
    if num_data is None and init is None:
        raise ValueError("solvegp needs num_data (the training-set size) when init is None")
    num_data = int(init[0].shape[0] if num_data is None else num_data)
    if num_data < 1:
        raise ValueError(f"num_data must be positive; got {num_data}")
    opts = prior_options(init, task, num_dims, **prior)
    num_latents = num_classes if num_classes is not None and num_classes > 2 else 1
    batch_shape = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
    mean, kernel = prior_modules(num_dims, opts, batch_shape=batch_shape)
    if init is None:
        z, o = torch.zeros(num_inducing, num_dims), torch.zeros(num_orthogonal, num_dims)
    else:
        z, o = initial_points(init[0], num_inducing, num_orthogonal, seed=seed,
                              max_points=kmeans_max_points)
    z = z.expand(num_latents, *z.shape).clone()  # the same start for every latent GP
    o = o.expand(num_latents, *o.shape).clone()
    if task == "regression":
        likelihood = gaussian_likelihood(opts["noise"])
    else:
        del opts["noise"]
        likelihood = Bernoulli() if num_latents == 1 else Softmax(num_classes=num_classes)
    options = {"num_inducing": int(num_inducing), "num_orthogonal": int(num_orthogonal),
               "objective": objective, "whiten": bool(whiten), "orthogonal_q": orthogonal_q,
               "seed": int(seed), "kmeans_max_points": int(kmeans_max_points),
               "num_data": num_data, "jitter": jitter, "num_quadrature": int(num_quadrature),
               "num_likelihood_samples": int(num_likelihood_samples),
               "optimal_q": bool(optimal_q), **opts}
    model = SolveGP(mean, kernel, likelihood, z, o, task=task, num_classes=num_classes,
                    num_dims=num_dims, num_data=num_data, objective=objective, whiten=whiten,
                    orthogonal_q=orthogonal_q, jitter=jitter, num_quadrature=num_quadrature,
                    num_likelihood_samples=num_likelihood_samples, seed=seed, options=options)
    model = follow_init(model, init)
    if init is not None:
        model.reset_variational()
    return model

