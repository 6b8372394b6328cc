"""Where the user's run lived before 0.2.0; it is :mod:`gpscale.run` now, re-exported here so
that imports of ``gpscale.benchmarks.runner`` keep working."""

from gpscale.run import (
    RunResult,
    RunSpec,
    feature_names,
    fit_config,
    load_data,
    plan_text,
    predict_test,
    resolve_auto,
    run,
    run_metrics,
    write_outputs,
    write_partial,
)

__all__ = ["RunSpec", "RunResult", "run", "run_metrics", "load_data", "predict_test",
           "write_outputs", "write_partial", "feature_names", "resolve_auto", "fit_config",
           "plan_text"]
