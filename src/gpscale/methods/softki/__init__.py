"""SoftKI: softmax kernel interpolation for high-dimensional GP regression (``softki``).

Camaño & Huang (2024), "High-Dimensional Gaussian Process Regression with Soft Kernel
Interpolation", arXiv:2410.21419 (notes/003_softki.md). The kernel is interpolated from m
learned points with softmax weights (W K_zz Wᵀ), which works in any dimension where a grid does
not; training takes minibatch steps on a Hutchinson pseudoloss, and the posterior is the QR of
a stacked matrix accumulated over chunks of the data, at O(n m²) time and O(chunk · m) memory.

==============  ================================================================================
``model``       :class:`SoftKI`, the losses, the predictive, the factory and the registration
                of ``softki``
``weights``     the softmax interpolation weights and the scaling of their distances
``posterior``   :class:`SoftKIPosterior`, streamed over the data (TSQR): what prediction and a
                saved model keep instead of the training data; :class:`SoftKIState`, what
                training conditions on a minibatch
``noise``       the calibration of the noise β² by the training likelihood
``pipeline``    what the pipeline needs beside the options: training defaults per preset, small
                test options
``validation``  the held-out rows: the score that picks the best epoch, and the calibration of
                β² and the outputscale on them (the default)
==============  ================================================================================

Importing the package registers ``softki``.
"""

from gpscale.methods.softki.model import PAPER_INIT, SoftKI, build_softki
from gpscale.methods.softki.posterior import SoftKIPosterior, SoftKIState
from gpscale.methods.softki.weights import DISTANCES, OBJECTIVES, SoftmaxInterpolation

__all__ = ["DISTANCES", "OBJECTIVES", "SoftKI", "SoftKIPosterior", "SoftKIState",
           "SoftmaxInterpolation", "build_softki", "PAPER_INIT"]
