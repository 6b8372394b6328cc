r"""``softki``: softmax kernel interpolation (SoftKI) for high-dimensional GP regression.

Camaño & Huang (2024), "High-Dimensional Gaussian Process Regression with Soft Kernel
Interpolation", arXiv:2410.21419 v1 (notes/003_softki.md, section numbers below refer to it).

=========  ========================  ======================================================
symbol     variable                  meaning
=========  ========================  ======================================================
x, y       ``x``, ``y``              (n, d) training inputs (or a minibatch), (n,) targets
c, r       ``mean_constant``,        fixed prior mean (mean of the init targets), r = y − c
           ``residual``
z          ``inducing_points``       (m, d) learned interpolation points
τ          ``temperature``           softmax temperature (the paper: τ = 1)
W_xz       ``weights``               (n, m) softmax interpolation weights, rows sum to 1
K_zz       ``K_zz``                  (m, m) kernel matrix of the points (RBF by default)
U          ``chol_zz``               (m, m) upper Cholesky factor, UᵀU = K_zz
K̂_xz       (never formed)            W K_zz, interpolated cross-covariance
G          ``W @ chol_zz.mT``        (n, m) whitened features, Q̃ = G Gᵀ
Q̃          (never formed)            W_xz K_zz W_zx, the SoftKI kernel; Σ = Q̃ + β² I
β²         ``noise``                 Gaussian noise variance (fixed at 1e-3 by default)
Ĉ          (never formed)            K_zz + K̂_zx K̂_xz / β² (Eq. 25) = Uᵀ (RᵀR) U
R          ``R``                     (m, m) upper, RᵀR = I + GᵀG / β² (eigenvalues ≥ 1)
γ          ``gamma``                 RᵀR γ = Gᵀ r / β²; mean μ(x*) = c + W_*z Uᵀγ
a_j, b_j   ``probes``, ``solves``    Gaussian probes (n, L) and sg(Σ⁻¹[r, a_1 … a_L])
=========  ========================  ======================================================

Equations implemented (§2):

- Weights (Def. 4.1, Eq. 17, §2.2): W_ij = softmax_j(−‖x_i − z_j‖₂ / τ), Euclidean (not
  squared) distances, log-sum-exp stable; τ = 1 is the paper's definition.
- Approximate kernel (Eq. 16, §2.3): Q̃ = W K_zz Wᵀ; any GPyTorch kernel gives K_zz.
- Posterior (Eq. 24–26, Alg. 1 lines 10–13, §2.7) by the QR of a stacked matrix, in the
  whitened form (§2.4's stable low-rank form): A = [G / β ; I] ((n + m) × m), AᵀA =
  I + GᵀG/β² = U⁻ᵀ Ĉ U⁻¹. The QR is taken of A augmented with the right-hand sides
  [r, a_1 … a_L] / β (zeros in the I rows) and accumulated over row chunks (TSQR:
  R ← qr([R; next chunk]).R), so A never exists in full; its next columns C = Qᵀ[ỹ, ã] give
  γ_j = R⁻¹ C_j, and the least-squares residuals give Σ⁻¹[r, a] = ([r, a] − G γ) / β²
  (Woodbury). The mean weights are Uᵀγ = K_zz α with the paper's α of Eq. 25. The corner
  entry ρ of the y column is the residual norm, ρ² = rᵀ Σ⁻¹ r.
- Predictive latent variance (§2.7, corrected form, not Eq. 24 as printed):
  K̂_*z Ĉ⁻¹ K̂_z* = ‖R⁻ᵀ U W_z*‖²; the predictive noise is β².
- Hutchinson pseudoloss (Def. 4.2, Eq. 19–22, §2.5), the default objective, minimised:
  [ (1/L) Σ_j a_jᵀ Σ_θ sg(b_j) − sg(b_0)ᵀ Σ_θ sg(b_0) ] / (2b), with Σ_θ u = W K_zz (Wᵀu)
  + β² u (never forming Σ). Its gradient estimates −∇ log p(y) / b.
- Exact marginal likelihood (Eq. 18, §2.4), ``objective='mll'``: −log p(y) / n =
  [n log 2πβ² + log|I + GᵀG/β²| + ρ²] / (2n) with the log-determinant 2 Σ log|R_ii|;
  differentiable through the QR (no Ĉ, no n × n matrix).

Both objectives are evaluated on the minibatch alone, as if it were the whole data set (the
paper's and the authors' code's semantics, §2.6), and divided by its size.

Cost: per step on a batch of b points O(b m d + m² d) for W and K_zz, O(b m² + m³) for G and
the QR, O(b m L) for the pseudoloss, all independent of n. ``condition`` on all n points costs
O(n m² + n m d) time and O(n m) memory (W; the QR holds one chunk of ``chunk_size`` rows).
Prediction: O(m² + m d) per test point, in chunks of test points.

Deviations from the paper and choices, with reasons (§7 lists the paper's errata):

- Loss sign (§7.1): Eq. 19 is minimised (Alg. 1's ascent step is the wrong direction).
- Probes (§7.2): unnormalised N(0, I), not unit-length (which biases the trace by 1/n).
- QR orientation (§7.5): the paper stacks [K̂_xz/β ; U] with UᵀU = K_zz (the *upper*
  factor). We stack the whitened [W Uᵀ/β ; I] instead: the same posterior, but R's condition
  number is at most ‖G‖/β, whereas the paper's R inherits K_zz's (10⁸ and more once points
  cluster). With the paper's form in float32 the pseudoloss can fall far below its bound
  −yᵀy/(2bβ²) once K_zz is ill-conditioned, and the test error then rises; the whitened form
  trains smoothly (test ``test_float32_solves_stay_accurate_when_K_zz_is_ill_conditioned``).
- Covariance (§7.6): the corrected SoR form above, not the printed Eq. 24.
- Held-out rows (not in the paper; option ``validation``, default 10 % of 1,000 training rows
  or more, at most 10,000 rows): the learned points overfit, so training keeps the epoch of
  best held-out NLL and β² and the outputscale are calibrated on those rows
  (:mod:`~gpscale.methods.softki.validation`); prediction then conditions on every row.
- The pseudoloss's solves come from the same QR as the posterior instead of a dense b × b
  LU solve (the paper's App. B.1): one factorisation, the same O(b m²) cost, and Σ is never
  formed.
- Temperature τ: not in the paper (§2.2); τ = 1 (default) is the paper's weights.
- Distances (default ``distance='relative'`` with ``ard=True``; the paper: Euclidean, one
  lengthscale): the softmax sees (x − z) ⊙ w with w_k = (1/ℓ_k) / rms(1/ℓ), the kernel's
  inverse ARD lengthscales rescaled to a root mean square of 1. With one shared lengthscale
  w = 1 and the weights are Def. 4.1's exactly; an input whose ℓ grows drops out of the weights
  as it drops out of K_zz. With Euclidean weights inputs that do not matter swamp the distances
  whatever the kernel learns: with many inputs of which few matter, SoftKI then predicts little
  more than the mean, where relative distances come close to the exact GP. ``'lengthscale'``
  (w = 1/ℓ, unnormalised) also couples the softmax's sharpness to ℓ, and did worse.
- The loss's value is −log p(y)/n, read off the QR, while its gradient is the pseudoloss's:
  the pseudoloss's own value is no objective (−½ rᵀΣ⁻¹r/n dominates it), and the plateau
  schedule of the default training settings stopped runs on its noise.
- Prior mean: a fixed constant c (the mean of the init targets, 0 on standardised data); the
  paper uses zero mean on standardised targets.
- K_zz is factorised in float64 (m × m, with jitter retries); the QR runs in the data's dtype,
  float32 by default, as the paper (the QR is the float32-stable route, §2.7).
- Initial lengthscale and outputscale: log 2 ≈ 0.693 each, GPyTorch's defaults, which the
  authors' code uses (§2.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from torch import Tensor, nn

from gpscale.distributions import Predictive
from gpscale.kernels import is_expression, kernel_matrix
from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.methods._common import (
    check_task_and_init,
    follow_init,
    inducing_options,
    initial_inducing_points,
    prior_modules,
    prior_options,
)
from gpscale.methods.base import Method, as_dtype, parameter_digest, predict_in_chunks
from gpscale.methods.options import INDUCING_OPTIONS, Option, prior_options_with
from gpscale.methods.registry import MethodSpec, register
from gpscale.methods.softki.pipeline import PIPELINE
from gpscale.methods.softki.posterior import (
    SoftKIPosterior,
    SoftKIState,
    stacked_qr,
    streamed_posterior,
)
from gpscale.methods.softki.validation import (
    VALIDATION_FRACTION,
    calibrate_after_training,
    held_out_score,
    holdout_rows,
)
from gpscale.methods.softki.weights import (
    DISTANCES,
    OBJECTIVES,
    SoftmaxInterpolation,
    check_options,
    distance_scale,
)
from gpscale.validation import check_x, check_xy

__all__ = ["DISTANCES", "OBJECTIVES", "SoftKI", "SoftKIPosterior", "SoftKIState",
           "SoftmaxInterpolation", "build_softki"]

PAPER_INIT = math.log(2.0)
"""GPyTorch's initial lengthscale and outputscale (softplus(0)), used by the authors' code."""


class SoftKI(Method):
    """Softmax kernel interpolation GP regression (key ``softki``).

    Args:
        kernel: any GPyTorch kernel (K_zz = kernel(z, z)); RBF with one lengthscale by default.
        inducing_points: z (m, d), learned.
        weights: the interpolation weight function ``(x, z, scale) -> W`` (n, m), e.g.
            :class:`SoftmaxInterpolation` (kept as ``self.interpolation``; :meth:`weights`
            calls it with :meth:`distance_scale`).
        noise: β² > 0.
        learn_noise: learn β² (log-parameterised) instead of keeping it fixed.
        mean_constant: the fixed prior mean c.
        objective: ``'pseudoloss'`` (Hutchinson, Eq. 19) or ``'mll'`` (exact, Eq. 18).
        num_probes: L, Gaussian probes per pseudoloss evaluation.
        chunk_size: rows of the stacked matrix per QR step in ``condition``.
        calibrate_noise: set β² by the exact likelihood after training (:meth:`finalize`).
        distance: ``'euclidean'`` (the paper's), ``'relative'`` or ``'lengthscale'``
            (:meth:`distance_scale`).
        learn_temperature: learn a factor of the softmax temperature (``log_temperature``).
        validation: share of the training rows held out (:meth:`holdout_rows`).
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> x = torch.randn(60, 3, dtype=torch.float64); y = x.sum(1)
        >>> model = build_softki(3, init=(x, y), num_inducing=8)
        >>> model.predict(model.condition(x, y), x[:4]).mean.shape
        torch.Size([4])
    """

    key = "softki"
    minibatch = True
    needs_data_for_prediction = True
    summary_types = (SoftKIPosterior,)

    def __init__(self, kernel: gpytorch.kernels.Kernel, inducing_points: Tensor,
                 weights: Callable[[Tensor, Tensor], Tensor], *, noise: float = 1e-3,
                 learn_noise: bool = False, mean_constant: float = 0.0,
                 objective: str = "pseudoloss", num_probes: int = 10, chunk_size: int = 4096,
                 calibrate_noise: bool = False, distance: str = "euclidean",
                 learn_temperature: bool = False, validation: float = 0.0,
                 options: dict[str, Any] | None = None):
        super().__init__(task="regression", options=options)
        check_options(noise=noise, objective=objective, num_probes=num_probes,
                       chunk_size=chunk_size, distance=distance)
        self.kernel = kernel
        self.inducing_points = nn.Parameter(inducing_points.clone())
        self.interpolation = weights
        self.distance = distance
        # a learned factor of the softmax temperature; absent (factor 1) unless asked for, so
        # models saved before the option existed load unchanged
        self.log_temperature = (nn.Parameter(torch.zeros((), dtype=inducing_points.dtype))
                                if learn_temperature else None)
        self.log_noise = nn.Parameter(torch.tensor(math.log(noise), dtype=inducing_points.dtype),
                                      requires_grad=bool(learn_noise))
        self.register_buffer("mean_constant",
                             torch.tensor(float(mean_constant), dtype=inducing_points.dtype))
        self.objective, self.num_probes, self.chunk_size = objective, num_probes, chunk_size
        self.calibrate_noise = bool(calibrate_noise)
        if not 0 <= validation < 1:
            raise ValueError(f"validation must be a share of the rows in [0, 1); got {validation}")
        self.validation = float(validation)
        self.num_dims = inducing_points.shape[-1]

    @property
    def noise(self) -> Tensor:
        """β², a scalar."""
        return self.log_noise.exp()

    def distance_scale(self) -> Tensor | None:
        """Per-input divisor of the softmax distances under ``distance`` (``None``: Euclidean,
        the paper's), times the learned temperature factor if any
        (:func:`~gpscale.methods.softki.weights.distance_scale`)."""
        tau = None if self.log_temperature is None else self.log_temperature.exp()
        return distance_scale(self.kernel, self.distance, tau,
                              num_dims=self.inducing_points.shape[-1])

    def weights(self, x: Tensor, z: Tensor) -> Tensor:
        """W_xz (n, m): the softmax interpolation weights of x on z under :meth:`distance_scale`."""
        return self.interpolation(x, z, self.distance_scale())

    def condition(self, x: Tensor, y: Tensor, probes: Tensor | None = None) -> SoftKIState:
        """W, K_zz, the chunked QR posterior and the pseudoloss solves; O(n m²), memory O(n m).

        Args:
            x: (n, d) inputs (a minibatch in training, all data for prediction).
            y: (n,) targets.
            probes: (n, L) probe vectors for the pseudoloss; default L = ``num_probes`` draws
                of N(0, I) from torch's global generator (none for ``objective='mll'``).
        """
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        z = self.inducing_points
        r = y.to(x.dtype) - self.mean_constant
        if probes is None:
            L = self.num_probes if self.objective == "pseudoloss" else 0
            probes = torch.randn(x.shape[0], L, dtype=x.dtype, device=x.device)
        elif probes.dim() != 2 or probes.shape[0] != x.shape[0]:
            raise ValueError(f"probes must be (n, L) with n = {x.shape[0]}; got "
                             f"{tuple(probes.shape)}")
        W = self.weights(x, z)  # (n, m), Eq. 17
        # K_zz from float64 points: in float32 the distance expansion can make it indefinite
        # beyond what jitter repairs (learned points, small lengthscale, d = 27 on KEGGu).
        K64 = kernel_matrix(self.kernel, upcast(z), upcast(z))  # (m, m)
        K = as_dtype(K64, z)
        U = as_dtype(safe_cholesky(K64, name="SoftKI K_zz").mT, z)  # UᵀU = K_zz
        G = W @ U.mT  # (n, m), Q̃ = G Gᵀ: the whitened features
        noise = self.noise
        rhs = torch.cat([r[:, None], probes.to(r.dtype)], 1)  # (n, L + 1)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.objective == "mll"):
            R_aug = stacked_qr(G, rhs, noise, self.chunk_size)
        m = z.shape[0]
        R, C = R_aug[:m, :m], R_aug[:m, m:]  # C = Qᵀ [r, a] / β
        gammas = torch.linalg.solve_triangular(R, C, upper=True)  # (m, L + 1)
        quad = R_aug[m, m].square()  # ρ², the y column's residual
        with torch.no_grad():
            solves = (rhs - G @ gammas) / noise  # Σ⁻¹ [r, a] (Woodbury)
        gamma = gammas[:, 0]
        return SoftKIState(z, W, K, U, r, noise, R, gamma, U.mT @ gamma, quad,
                           probes.to(r.dtype), solves)

    def loss(self, state: SoftKIState) -> Tensor:
        """The objective per datum, −log p(y)/n (``negative_mll``) in value either way; its
        gradient is the pseudoloss's Hutchinson estimate (default) or the exact one (``mll``).

        The pseudoloss's *value* is not an objective (its quadratic term is −½ rᵀΣ⁻¹r/n, which
        can move by hundreds per datum over a run the plateau schedule then calls converged),
        so a schedule watching it acts on noise; the exact
        value costs nothing extra, it is read off the QR the pseudoloss's solves come from.
        """
        if self.objective == "mll":
            return self.negative_mll(state)
        surrogate = self.pseudoloss(state)
        return surrogate + (self.negative_mll(state) - surrogate).detach()

    def pseudoloss(self, state: SoftKIState) -> Tensor:
        """Eq. 19 (sign corrected, §2.5) per datum: ``trace_term + quad_term``."""
        return self.trace_term(state) + self.quad_term(state)

    def trace_term(self, state: SoftKIState) -> Tensor:
        """(1/(2 L b)) Σ_j a_jᵀ Σ_θ sg(b_j): its gradient estimates ½ tr(Σ⁻¹ ∇Σ) / b."""
        L = state.probes.shape[1]
        if L == 0:
            raise ValueError("the pseudoloss needs probes (num_probes ≥ 1)")
        value = _sigma_form(state, state.probes, state.solves[:, 1:])
        return value / (2 * L * state.num_points)

    def quad_term(self, state: SoftKIState) -> Tensor:
        """−(1/(2b)) sg(b_0)ᵀ Σ_θ sg(b_0): its gradient is −½ (Σ⁻¹r)ᵀ ∇Σ (Σ⁻¹r) / b."""
        b0 = state.solves[:, :1]
        return -_sigma_form(state, b0, b0) / (2 * state.num_points)

    def negative_mll(self, state: SoftKIState) -> Tensor:
        """−log N(r | 0, Q̃ + β²I) / n from the QR (Eq. 18, §2.4); O(n m²).

        Differentiable when the model's objective is ``'mll'`` (else a value only).
        """
        n = state.num_points
        logdet = n * state.noise.log() + 2 * state.R.diagonal().abs().log().sum()  # log|Σ|
        return 0.5 * (logdet + state.quad + n * math.log(2 * math.pi)) / n

    def finalize(self, x: Tensor, y: Tensor, reduce: Callable[[Tensor], Tensor] | None = None,
                 held: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
                 ) -> dict[str, float] | None:
        """After training, when ``calibrate_noise`` is on (also when β² was learned: a minibatch
        objective that treats each batch as the whole data set biases it): β² and the
        outputscale by the held-out rows of ``held`` = ((x, y) trained on, (x, y) held out),
        else β² by the marginal likelihood of ``(x, y)``; ``reduce`` sums a tensor over the
        ranks of a data-parallel run
        (:func:`~gpscale.methods.softki.validation.calibrate_after_training`)."""
        if not self.calibrate_noise:
            return None
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        with torch.no_grad():
            return calibrate_after_training(self, x, y, reduce, held)

    def holdout_rows(self, n: int) -> int:
        """Training rows to hold out of ``n`` to pick the best epoch and calibrate by (option
        ``validation``; none without ``calibrate_noise``)."""
        return holdout_rows(n, self.validation) if self.calibrate_noise else 0

    def validation_score(self, fit: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor],
                         seed: int = 0) -> Callable[[nn.Module], dict[str, float]]:
        """The held-out score after each epoch (:func:`~gpscale.methods.softki.validation.
        held_out_score`)."""
        return held_out_score(fit, held, seed=seed)

    def posterior(self, x: Tensor, y: Tensor) -> SoftKIPosterior:
        """What :meth:`predict` needs, streamed over chunks of (x, y): O(n m²) time, memory
        O(chunk · m) (:mod:`~gpscale.methods.softki.posterior`); predicts as
        ``condition(x, y)`` does."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        with torch.no_grad():
            z = self.inducing_points.detach()
            U = as_dtype(safe_cholesky(kernel_matrix(self.kernel, upcast(z), upcast(z)),
                                       name="SoftKI K_zz").mT, z)
            r = y.to(x.dtype) - self.mean_constant
            return streamed_posterior(lambda xc: self.weights(xc, z) @ U.mT, x, r, z=z, U=U,
                                      noise=self.noise.detach(), chunk_size=self.chunk_size,
                                      digest=parameter_digest(self))

    def summary(self, state: SoftKIPosterior) -> SoftKIPosterior:
        """A saved model keeps the m-sized posterior of :meth:`posterior` (not the data)."""
        if not isinstance(state, SoftKIPosterior):
            raise TypeError("SoftKI summarises the output of model.posterior(x, y); got a "
                            f"{type(state).__name__}")
        state.check(parameter_digest(self))
        return state

    def from_summary(self, summary: SoftKIPosterior) -> SoftKIPosterior:
        """The posterior back, refused if the model's parameters are not its own."""
        summary.check(parameter_digest(self))
        return summary

    def predict(self, state: SoftKIState | SoftKIPosterior, x_test: Tensor,
                chunk_size: int = 4096) -> Predictive:
        """μ = c + W_*z Uᵀγ and K̂_*z Ĉ⁻¹ K̂_z* = ‖R⁻ᵀ U W_z*‖², in chunks of test points."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")

        def chunk(xc: Tensor) -> Predictive:
            W = self.weights(xc, state.inducing_points)  # (t, m)
            mean = self.mean_constant + W @ state.mean_weights
            V = torch.linalg.solve_triangular(state.R.mT, state.chol_zz @ W.mT, upper=False)
            return Predictive(mean, V.square().sum(0), noise=state.noise)

        return predict_in_chunks(chunk, x_test, chunk_size)


def _sigma_form(state: SoftKIState, A: Tensor, B: Tensor) -> Tensor:
    """Σ_j A_jᵀ Σ_θ B_j = Σ_j [(WᵀA_j)ᵀ K_zz (WᵀB_j) + β² A_jᵀ B_j] without forming Σ."""
    WA, WB = state.weights.mT @ A, state.weights.mT @ B  # (m, k)
    return (WA * (state.K_zz @ WB)).sum() + state.noise * (A * B).sum()


def build_softki(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
                 init: tuple[Tensor, Tensor] | None = None, num_inducing: int | None = None,
                 temperature: float = 1.0, objective: str = "pseudoloss", num_probes: int = 10,
                 noise: float = 1e-3, learn_noise: bool = False, kernel: str = "rbf",
                 ard: bool = True, lengthscale: float | None = None,
                 outputscale: float | None = None, mean_constant: float | None = None,
                 seed: int = 0, kmeans_max_points: int = 10_000,
                 chunk_size: int = 4096, calibrate_noise: bool = True,
                 distance: str = "relative", learn_temperature: bool = False,
                 validation: float = VALIDATION_FRACTION) -> SoftKI:
    """Factory of ``softki`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)``: points start at k-means centres of x, c = mean(y); ``None``
            allocates placeholders to be overwritten by ``load_state_dict``.
        num_inducing: m (the paper: 512); ``None``: min(512, n/2).
        temperature: τ of the softmax weights (the paper: 1).
        objective: ``'pseudoloss'`` (Hutchinson, the paper's) or ``'mll'`` (exact).
        num_probes: L Gaussian probes of the pseudoloss (the authors' code: 10).
        noise: β² (the paper: fixed 1e-3).
        learn_noise: learn β² too (the paper found fixed noise better, §2.8).
        kernel: a name of :data:`gpscale.kernels.KERNELS` (default ``'rbf'``, as the paper).
        ard: one lengthscale per input dimension (default; the paper: one shared lengthscale).
        lengthscale, outputscale: initial values (default log 2, GPyTorch's defaults).
        mean_constant: the fixed prior mean (default: mean of the init targets, else 0).
        seed: seeds the k-means subsample and k-means.
        kmeans_max_points: k-means runs on at most this many (random) rows of x.
        chunk_size: rows per QR step when conditioning (memory O(chunk_size · m)).
        distance: ``'relative'`` (default) rescales each input of the softmax distances by its
            inverse lengthscale relative to the others, ``'lengthscale'`` by 1/ℓ itself,
            ``'euclidean'`` is the paper's (see the module notes).
        learn_temperature: learn a factor exp(``log_temperature``) of the softmax temperature
            by the same objective (off by default: it sharpens the weights until they overfit,
            see the module notes).
        calibrate_noise: after training, set β² (:meth:`SoftKI.finalize`); ``False`` keeps the
            trained (or fixed) β² as the paper.
        validation: share of the training rows held out (at most 10,000) to pick the best epoch
            and calibrate β² and the outputscale by; 0: β² by the training likelihood.

    Raises:
        ValueError: a task other than regression, invalid ``init`` data, fewer init points than
            ``num_inducing``, an unknown kernel or objective, or a non-positive temperature,
            noise, number of probes or chunk size.
    """
    check_task_and_init("softki", task, ("regression",), num_dims, init)
    check_options(noise=noise, objective=objective, num_probes=num_probes,
                   chunk_size=chunk_size, distance=distance)
    weights = SoftmaxInterpolation(temperature)
    ind = inducing_options(init, num_inducing=num_inducing, seed=seed,
                           kmeans_max_points=kmeans_max_points)
    opts = prior_options(init, task, num_dims, kernel=kernel, ard=ard,
                         lengthscale=(None if is_expression(kernel) else PAPER_INIT)
                         if lengthscale is None else lengthscale,
                         outputscale=PAPER_INIT if outputscale is None else outputscale,
                         noise=noise, mean_constant=mean_constant)
    _, kern = prior_modules(num_dims, opts)
    z = initial_inducing_points(init, num_dims, ind)
    model = SoftKI(kern, z, weights, noise=opts["noise"], learn_noise=learn_noise,
                   mean_constant=opts["mean_constant"], objective=objective,
                   num_probes=num_probes, chunk_size=chunk_size,
                   calibrate_noise=calibrate_noise, distance=distance,
                   learn_temperature=learn_temperature, validation=validation,
                   options={**ind, **opts, "temperature": float(temperature),
                            "distance": distance, "learn_temperature": bool(learn_temperature),
                            "objective": objective, "num_probes": num_probes,
                            "learn_noise": bool(learn_noise), "chunk_size": chunk_size,
                            "calibrate_noise": bool(calibrate_noise),
                            "validation": float(validation)})
    return follow_init(model, init)


# §2.6: Adam, lr 0.01, batch 1024, 50 epochs, float32 (the authors' code), constant lr.
register(MethodSpec(
    key="softki",
    **PIPELINE["softki"],
    factory=build_softki,
    tasks=("regression",),
    summary="SoftKI: softmax interpolation from m learned points, Hutchinson pseudoloss, "
            "QR posterior (O(b m²) per step)",
    options=INDUCING_OPTIONS + (
        Option("temperature", "float", 1.0, "softmax temperature τ", minimum=0, exclusive=True),
        Option("distance", "str", "relative", "softmax distances: 'relative' divides each "
               "input by its ARD lengthscale relative to the others, 'lengthscale' by the "
               "lengthscale itself, 'euclidean' is the paper's", choices=DISTANCES),
        Option("learn_temperature", "bool", False, "learn a factor of the softmax temperature"),
        Option("objective", "str", "pseudoloss", "Hutchinson pseudoloss (the paper's) or the "
               "exact likelihood", choices=OBJECTIVES),
        Option("num_probes", "int", 10, "Gaussian probes of the pseudoloss", minimum=1),
        Option("noise", "float", 1e-3, "noise variance β² (the paper: fixed 1e-3)", minimum=0,
               exclusive=True),
        Option("learn_noise", "bool", False, "learn β² too"),
        *prior_options_with(kernel="rbf", ard=True, noise=False),
        Option("chunk_size", "int", 4096, "rows per block of the interpolation products",
               minimum=1),
        Option("calibrate_noise", "bool", True, "after training, set β² (and with held-out "
               "rows the outputscale) by the data (false: keep the fixed β² as the paper)"),
        Option("validation", "float", VALIDATION_FRACTION, "share of the training rows held "
               "out (at most 10,000) to pick the best epoch and calibrate by; 0: none",
               minimum=0),
    ),
    # files saved before distances followed ℓ, or before rows were held out
    saved_defaults={"distance": "euclidean", "validation": 0.0},
))
