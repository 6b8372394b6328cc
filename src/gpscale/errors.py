"""Exceptions raised by gpscale.

Every error names what went wrong and what to change. ``ValueError`` subclasses are raised for bad
input at public entry points; :class:`NumericalError` for a factorisation or solve that fails
after the documented remedies (jitter escalation) were tried; :class:`NonFiniteLossError` when
training produces a NaN or infinite loss; :class:`SavedFileError` (a ``ValueError``) for a model
file or checkpoint that is corrupt, foreign or does not match the run.
"""

from __future__ import annotations


class NumericalError(RuntimeError):
    """A factorisation or solve failed; the message names the matrix, shape, dtype and jitter."""


class NonFiniteLossError(FloatingPointError):
    """Training produced a non-finite loss.

    Attributes:
        epoch: the epoch (1-based) in which the loss became non-finite.
        history: the :class:`gpscale.training.History` recorded up to that point.
        checkpoint: path of the last good checkpoint, or ``None`` when none was written.
    """

    def __init__(self, message: str, *, epoch: int, history=None, checkpoint=None):
        super().__init__(message)
        self.epoch = epoch
        self.history = history
        self.checkpoint = checkpoint


class SavedFileError(ValueError):
    """A model file or checkpoint cannot be used: empty, truncated, corrupt (checksum
    mismatch), not written by gpscale, of an unknown format version, or (a checkpoint) written
    by another run (other method, parameter shapes or training data).

    Attributes:
        path: the file.
    """

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)


class ConvergenceWarning(RuntimeWarning):
    """An iterative solve stopped short of its tolerance; the message names the residual it
    reached and what was done about it (a tighter re-solve, or nothing left to try)."""


class CalibrationWarning(RuntimeWarning):
    """A regression model's central 95 % predictive intervals covered a share of the test rows
    further from 95 % than the rows' count explains; the message names the coverage."""


class DeviceMemoryError(MemoryError):
    """A run needs more memory than its device has: refused before training where the need is
    known (the dense baselines' n × n matrices), or torch ran out mid-run. The message is one
    line naming the device, the memory and what to change."""
