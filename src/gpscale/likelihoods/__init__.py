"""Likelihoods for Laplace/Newton inference: log p, gradient, products with W and W⁻¹.

W(f) = −∇² log p(y | f). Latent values are (L, n) with L = ``num_latents`` (class-major).

=============  ==========  =======================  ===========================
class          L           W                        ``W_inv_matmul``
=============  ==========  =======================  ===========================
``Gaussian``   1           Λ⁻¹ (constant)           Λ
``Bernoulli``  1           diag(σ(f)σ(−f))          diag(2 + 2 cosh f)
``Poisson``    1           diag(e^f)                diag(e^{−f})
``Softmax``    C           blockdiag(diag π − ππᵀ)  pseudo-inverse (Lemma A.7)
=============  ==========  =======================  ===========================
"""

from gpscale.likelihoods.base import Likelihood
from gpscale.likelihoods.bernoulli import Bernoulli
from gpscale.likelihoods.gaussian import Gaussian
from gpscale.likelihoods.poisson import Poisson
from gpscale.likelihoods.softmax import Softmax

__all__ = ["Bernoulli", "Gaussian", "Likelihood", "Poisson", "Softmax"]
