"""IterNCGP's kernel-learning objectives: the problem a round fixes and the value it
maximises, as methods of :class:`~gpscale.methods.iterncgp.IterNCGP` (a mixin, to keep the
algorithm's module about the algorithm)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from torch import Tensor

from gpscale.methods.iterncgp.evidence import (
    Evidence,
    EvidenceProblem,
    evidence_problem,
    laplace_evidence,
    variational_evidence,
)
from gpscale.methods.iterncgp.solver import IterNCGPState
from gpscale.methods.iterncgp.variational import Sites, expected_terms, refine, state_sites

__all__ = ["KernelLearningMixin"]


class KernelLearningMixin:
    """Needs ``kernel_learning``, ``variational``, ``likelihood``, ``latent_kernel`` and
    ``prior_mean`` (an IterNCGP)."""

    @property
    def kernel_objective(self) -> str:
        """What kernel learning maximises (``kernel_learning.objective``, ``auto`` resolved)."""
        objective = self.kernel_learning.objective
        if objective == "auto":
            return "variational" if self.variational.enabled else "elbo"
        return objective

    def evidence_problem(self, state: IterNCGPState) -> EvidenceProblem:
        """Fix the iterate, W (or the variational sites of ``state``'s q) and the actions."""
        x = state.x
        K_matmul = self.latent_kernel.training_matmul(x)
        lik, reference = self.likelihood, None
        if self.kernel_objective == "variational":
            lik, reference = state_sites(self, state, K_matmul)
        problem = evidence_problem(lik, x, state.y, state.f, state.S,
                                   prior_mean=self.prior_mean, kernel_matmul=K_matmul,
                                   rank=self.kernel_learning.rank)
        del K_matmul  # the held K (if any) goes before the round's distances come
        return replace(problem, kernel_matmul=self.latent_kernel.learning_matmul(x),
                       reference=reference)

    def warm_condition(self, state: IterNCGPState, sites=None) -> IterNCGPState:
        """The posterior under the current kernel, warm-started from ``state`` (another
        kernel's): with the variational refinement and the previous q's ``sites``
        (:class:`~gpscale.methods.iterncgp.variational.Sites`) it refines from them directly;
        otherwise Newton from the kept representer weights and actions, then the refinement."""
        f, v, belief = self.warm_start(state)
        if not (self.variational.enabled and isinstance(sites, Sites)):
            return self.refine(self.newton(state.x, state.y, f, v, belief))
        start = IterNCGPState(state.x, state.y, f, v, belief.S[..., :0], belief.S, belief.T,
                              (), False)
        return refine(self, state.x, state.y, start,
                      self.latent_kernel.training_matmul(state.x), sites)

    def _kernel_product(self, problem: EvidenceProblem):
        x = problem.x
        return problem.kernel_matmul or partial(self.latent_kernel.matmul, x, x)

    def log_evidence(self, problem: EvidenceProblem) -> Evidence:
        """The computation-aware Laplace evidence per datum under the current kernel,
        differentiable in its hyperparameters (:mod:`gpscale.methods.iterncgp.evidence`)."""
        return laplace_evidence(self._kernel_product(problem),
                                self.latent_kernel.diag(problem.x), problem)

    def learning_objective(self, problem: EvidenceProblem) -> Tensor:
        """The value a kernel-learning round maximises (:attr:`kernel_objective`), per datum."""
        if self.kernel_objective != "variational":
            evidence = self.log_evidence(problem)
            return evidence.projected if self.kernel_objective == "projected" else \
                evidence.log_evidence
        x, lik, plan = problem.x, self.likelihood, self.variational

        def expectation(mean: Tensor, cov: Tensor, root: Tensor) -> Tensor:
            return expected_terms(lik, problem.y, mean, cov, plan, derivatives=False,
                                  root=root)[0]

        return variational_evidence(self._kernel_product(problem),
                                    self.latent_kernel.diag(x), problem, lik, problem.y,
                                    self.prior_mean, expectation)
