"""SoftKI: softmax kernel interpolation for high-dimensional GP regression (``softki``).

Camaño & Huang (2024), "High-Dimensional Gaussian Process Regression with Soft Kernel
Interpolation", arXiv:2410.21419 (notes/003_softki.md). The kernel is interpolated from m
learned points with softmax weights (W K_zz Wᵀ), which works in any dimension where a grid does
not; training takes minibatch steps on a Hutchinson pseudoloss, and the posterior is the QR of
a stacked matrix accumulated over chunks of the data, at O(n m²) time and O(chunk · m) memory.

=============  =================================================================================
``model``      :class:`SoftKI` and its state, the losses, the predictive, the factory and the
               registration of ``softki``
``weights``    the softmax interpolation weights and the scaling of their distances
``posterior``  :class:`SoftKIPosterior`, streamed over the data (TSQR): what prediction and a
               saved model keep instead of the training data
``noise``      the calibration of the noise β² once the interpolant is trained
=============  =================================================================================

Importing the package registers ``softki``.
"""

from gpscale.methods.softki.model import PAPER_INIT, SoftKI, SoftKIState, build_softki
from gpscale.methods.softki.posterior import SoftKIPosterior
from gpscale.methods.softki.weights import DISTANCES, OBJECTIVES, SoftmaxInterpolation

__all__ = ["DISTANCES", "OBJECTIVES", "SoftKI", "SoftKIPosterior", "SoftKIState",
           "SoftmaxInterpolation", "build_softki", "PAPER_INIT"]
