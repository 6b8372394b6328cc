"""The training loop (``fit``), its configuration, history and callbacks."""

from gpscale.training.callbacks import Evaluate, LogMetrics
from gpscale.training.config import (
    METHOD_DEFAULTS,
    PAPER_DEFAULTS,
    PRESETS,
    FitConfig,
    default_fit_config,
    resolve_fit_config,
)
from gpscale.training.fit import condition_only, default_loss, fit
from gpscale.training.history import History

__all__ = [
    "fit", "condition_only", "default_loss", "FitConfig", "resolve_fit_config",
    "METHOD_DEFAULTS", "PAPER_DEFAULTS", "PRESETS", "default_fit_config", "History",
    "Evaluate", "LogMetrics",
]
