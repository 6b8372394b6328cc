"""The user's run — what ``gpscale fit`` does — on one dataset: spec → data → method choice
(``auto``) → training → evaluation → outputs, in this process (:class:`OneProcess`) or as the
ranks of a data-parallel run (``gpscale fit --nproc``: :class:`gpscale.run_parallel.Ranks`),
the one pipeline for both; the benchmark suites (:mod:`gpscale.benchmarks`) sit on top.

``run(RunSpec(...))`` loads the data (standardised with training statistics), builds and trains
the method through :mod:`gpscale.training.harness` (test metrics every ``eval_every`` epochs,
outside the training clock), evaluates the final model and, with ``out``, writes
``metrics.json``, ``history.csv``, ``history.json`` and ``model.pt`` there. All metrics are on the
standardised target scale, as the papers report them. ``metrics.json`` is strict JSON: a
non-finite metric is written as ``null``. ``model.pt`` holds the training data only for methods
that condition on it to predict (``needs_data_for_prediction``); it records the names of the
raw input columns (the CSV header's, else ``x0..x{d-1}``) so that ``gpscale predict`` matches
columns by name.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from gpscale.commit import new_run_id, write_together
from gpscale.data import Dataset, load_csv, load_dataset
from gpscale.data.datasets import get_entry
from gpscale.data.options import check_data_options, check_file_options
from gpscale.devices import inducing_options, on_cpu_after_oom
from gpscale.distributions import Predictive
from gpscale.errors import CalibrationWarning, NonFiniteLossError
from gpscale.files import atomic_write
from gpscale.io import save
from gpscale.methods import auto
from gpscale.methods.auto import AUTO
from gpscale.methods.base import Method, module_device
from gpscale.methods.options import composed_dtype, kernel_in_model_units
from gpscale.methods.registry import get_spec
from gpscale.metrics import json_safe
from gpscale.training import Evaluate, FitConfig, History, resolve_fit_config
from gpscale.training.calibration import coverage_message
from gpscale.training.config import DEFAULT_BUDGET_S
from gpscale.training.harness import cast, train_method
from gpscale.training.prefit import exact_prefit_wanted
from gpscale.training.race import AutoPick, final_budget, pick_auto, warm_options

__all__ = ["RunSpec", "RunResult", "Outcome", "OneProcess", "run", "run_metrics", "load_data",
           "predict_test", "write_outputs", "write_partial", "feature_names", "resolve_auto",
           "fit_config", "plan_text"]

log = logging.getLogger("gpscale.run")


@dataclass(frozen=True)
class RunSpec:
    """What to train and how; ``None`` fields take the method's defaults.

    Attributes:
        method: registry key (``gpscale methods`` lists them).
        dataset: dataset name (``gpscale datasets``); or ``csv`` with ``target``.
        csv: path of a user CSV file (instead of ``dataset``).
        target: the CSV's target column (name or index).
        task: task of a CSV dataset (regression, classification, counts).
        split, seed: data split and seed (seed also drives initialisation and shuffling).
        epochs, lr, batch_size, optimizer, max_time, scheduler: training overrides.
        preset: the training defaults these override: ``"default"`` (stop on convergence
            within a time budget), ``"paper"`` (the fixed epochs of the benchmark suites) or
            ``"optimum"`` (default, trained on to the objective's optimum:
            :data:`~gpscale.training.config.OPTIMUM_CHANGES`).
        eval_every: epochs between test evaluations during training; 0 evaluates only at the end.
        dtype: ``"float32"`` or ``"float64"``; ``None`` takes the method's default.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``; ``None`` is the CPU.
        options: method options (``num_inducing``, ``kernel``, ...).
        dataset_options: keyword arguments for the dataset loader (e.g. ``n`` of a generator).
        out: folder for metrics.json, history.csv/json and model.pt.
        checkpoint: checkpoint path; a killed run resumes from it.
        progress: progress bar (``None``: only on a terminal).
    """

    method: str
    dataset: str | None = None
    csv: str | None = None
    target: str | None = None
    task: str = "regression"
    split: int = 0
    seed: int = 0
    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    max_time: float | None = None
    scheduler: str | None = None
    preset: str = "default"
    eval_every: int = 0
    dtype: str | None = None
    device: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    out: str | None = None
    checkpoint: str | None = None
    progress: bool | None = None

    def __post_init__(self):
        if (self.dataset is None) == (self.csv is None):
            raise ValueError("give exactly one of a dataset name or a CSV file")
        if self.csv is not None and self.target is None:
            if "labels" not in self.dataset_options:
                raise ValueError("a CSV file needs --target COLUMN (a name or an index)")
            object.__setattr__(self, "target", -1)  # the labels file's column
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be ≥ 0; got {self.eval_every}")
        if self.dataset is not None:  # an unknown name or option: ValueError listing the valid
            entry = get_entry(self.dataset)  # ones (split and seed are fields of their own)
            object.__setattr__(self, "dataset_options", check_data_options(
                entry.name, entry.options, self.dataset_options))
        else:  # a file of the user's own: its reading options (header, delimiter, ...)
            object.__setattr__(self, "dataset_options",
                               check_file_options(str(self.csv), self.dataset_options))
        # Unknown method: ValueError listing valid ones; options checked against the
        # method's declaration and typed ("32" from the command line becomes 32). "auto"
        # is resolved once the data are loaded (resolve_auto), its options checked then.
        if self.method != AUTO:
            typed = get_spec(self.method).resolve(self.options, fill_defaults=False)
            object.__setattr__(self, "options", typed)
        else:
            task = get_entry(self.dataset).task if self.dataset is not None else self.task
            auto.check_options(task, self.options)


@dataclass
class RunResult:
    """Metrics, history and the trained model of one run."""

    metrics: dict[str, Any]
    history: History
    model: Method
    data: Dataset


def load_data(spec: RunSpec) -> Dataset:
    if spec.csv is not None:  # a target of digits is a column name first, else an index
        images = spec.method != "auto" and get_spec(spec.method).inputs == "images"
        return load_csv(spec.csv, str(spec.target), task=spec.task, seed=spec.split,
                        standardize_x=not images, **spec.dataset_options)
    return load_dataset(spec.dataset, split=spec.split, seed=spec.seed, **spec.dataset_options)


def with_item_shape(spec: RunSpec, data: Dataset) -> RunSpec:
    """``spec`` with the shape of the items of an image array (``--data-option labels=``) as
    the ``image_shape`` option of an image method that was given none."""
    shape = data.info.get("item_shape") if data.info else None
    if shape is None or spec.method == AUTO or "image_shape" in spec.options:
        return spec
    method = get_spec(spec.method)
    if method.inputs != "images" or "image_shape" not in {o.name for o in method.options}:
        return spec
    return replace(spec, options={**spec.options, "image_shape": list(shape)})


def resolve_auto(spec: RunSpec, data: Dataset,
                 agree: Callable[[Callable[[], AutoPick]], AutoPick] | None = None,
                 parallel: bool = False, race_limit: float | None = None
                 ) -> tuple[RunSpec, dict[str, torch.Tensor] | None, str | None]:
    """``spec`` with ``method="auto"`` replaced by the key ``auto`` picks for ``data``
    (:func:`gpscale.training.race.pick_auto`: a race on held-out rows, or the rules), its
    reason logged on ``gpscale.fit``, the parameters the winner starts from (``None``
    without a race) and the reason (``None`` for a spec that names its method). After a
    race, the winner's budget is what the race left of the run's (``max_time``, else the
    default budget). Any other spec comes back unchanged.

    ``agree(choose)`` runs ``choose`` where the processes of a data-parallel run agree on one
    result (rank 0 chooses, the others receive it); ``parallel`` leaves out the keys without a
    data-parallel path; ``race_limit``: most seconds the race may take (the others' wait)."""
    if spec.method != AUTO:
        return spec, None, None
    tic = time.perf_counter()
    budget = DEFAULT_BUDGET_S if spec.max_time is None else spec.max_time

    def choose() -> AutoPick:
        return pick_auto(data.task, data.x_train, data.y_train, num_classes=data.num_classes,
                         options=spec.options,
                         device=FitConfig(device=spec.device or "cpu").torch_device,
                         seed=spec.seed, budget=budget, epochs=spec.epochs, parallel=parallel,
                         race_limit=race_limit,
                         config_for=lambda key: fit_config(replace(spec, method=key),
                                                           data.num_train)[0])

    picked = choose() if agree is None else agree(choose)
    key = picked.choice.method
    if picked.race is None:
        return replace(spec, method=key, options=picked.options), None, picked.choice.reason
    left = final_budget(budget, time.perf_counter() - tic)
    options = warm_options(key, picked.options, spec.options, picked.warm)
    return (replace(spec, method=key, options=options, max_time=left), picked.warm,
            picked.choice.reason)


def fit_config(spec: RunSpec, num_train: int) -> tuple[FitConfig, torch.dtype]:
    """The method's default training options with the spec's overrides applied, and its dtype."""
    config = resolve_fit_config(
        spec.method, num_train, preset=spec.preset,
        dtype=composed_dtype(spec.options, spec.dtype), epochs=spec.epochs,
        lr=spec.lr, batch_size=spec.batch_size, optimizer=spec.optimizer,
        max_time=spec.max_time, scheduler=spec.scheduler, seed=spec.seed,
        checkpoint=spec.checkpoint, progress=spec.progress, eval_every=spec.eval_every or None,
        device=spec.device)
    return config, config.torch_dtype


def plan_text(method: str, config: FitConfig, options: dict[str, Any] | None = None,
              num_train: int | None = None, num_latents: int = 1,
              task: str = "regression") -> str:
    """One line saying how ``method`` will train: budget, schedule, stopping rule (and the
    pre-fit's learning rate when ``num_train`` points call for a pre-fit, or are not given;
    IterNCGP: the points its kernel rounds see, for ``num_latents`` latent functions; on a GPU
    the batch and inducing sets sized for it)."""
    spec = get_spec(method)
    opts = spec.resolve(options or {})
    if spec.plan is not None:  # a method that does not train by gradient epochs says how
        return f"{method}: " + spec.plan(opts, config.max_time, num_train, num_latents)
    budget = f"{config.epochs} epochs"
    if config.max_time is not None:
        budget += f" or {config.max_time:g} s"
    batch = "full batch" if config.batch_size is None else f"batches of {config.batch_size:,}"
    given = options or {}
    filled = ({} if num_train is None else
              inducing_options(method, given, config.torch_device, task, num_train))
    # the sizes filled in for the device; an option given as none stays none off a GPU
    sized = {k: v for k, v in filled.items() if v is not None and given.get(k) is None}
    if sized:  # inducing sets sized for a GPU (gpscale.devices)
        batch += ", " + " + ".join(f"{v:,}" for v in sized.values()) + " inducing points"
    flags = ["--batch-size"] * (config.batch_size is not None) + [f"-o {k}" for k in sized]
    if flags and config.torch_device.type == "cuda":
        batch += f" sized for {config.torch_device} ({', '.join(flags)})"
    floor = config.lr * config.lr_end_factor
    anneal = " and at 50/75/90% of the budget" * bool(config.budget_anneal
                                                        and config.batch_size is not None)
    rule = {"plateau": f"lr {config.lr:g} lowered x{config.plateau_factor:g} on each loss "
                       f"plateau{anneal}, stopping when converged (lr below {floor:g}"
                       + (", or a steady plateau within the loss's noise)"
                          if config.noise_plateau and config.batch_size is None else ")"),
            "linear": f"lr {config.lr:g} decaying linearly over the epochs",
            "budget": f"lr {config.lr:g} decaying linearly over the budget",
            "none": f"constant lr {config.lr:g}"}[config.scheduler]
    prefit = (opts.get("prefit") in ("auto", "exact") if num_train is None
              else exact_prefit_wanted(opts, num_train))
    if prefit and config.lr > opts["prefit_max_lr"]:
        rule += f"; lr {opts['prefit_max_lr']:g} from an exact-GP pre-fit on a subset"
    return (f"{method}: training for at most {budget} ({config.optimizer}, {batch}, "
            f"{config.dtype}; {rule}); --epochs / --max-time change the budget")


def predict_test(model: Method, x: torch.Tensor, y: torch.Tensor,
                 x_test: torch.Tensor, state: Any = None, *,
                 cpu_fallback: bool = True) -> Predictive:
    """Condition on the training data (unless ``state`` is given) and predict at ``x_test``
    without gradients, on the model's device; the predictive comes back on the CPU. Where a GPU
    runs out of memory, the model moves to the CPU and conditions and predicts there
    (:func:`~gpscale.devices.on_cpu_after_oom`) unless not ``cpu_fallback`` (an
    evaluation during training, whose optimiser stays on the GPU)."""
    on = module_device(model)

    def compute(device: torch.device) -> Predictive:
        with torch.no_grad():
            given = state if device == on else None  # a state on the GPU stays there
            conditioned = model.posterior(x.to(device), y.to(device)) if given is None else given
            return model.predict(conditioned, x_test.to(device)).to("cpu")

    if not cpu_fallback:
        return compute(on)
    return on_cpu_after_oom(compute, model, "predicting the test points")


@dataclass
class Outcome:
    """What a :class:`Processes` strategy hands back after training.

    Attributes:
        model, history, setup_time: the trained model, its history and the build time.
        predict: ``predict(x_test) -> Predictive`` with the trained model, on the CPU.
        saved: ``saved() -> ((x, y) or None, state or None)``: the training rows and the
            conditioned state ``model.pt`` may keep (a collective across ranks).
    """

    model: Method
    history: History
    setup_time: float
    predict: Callable[[torch.Tensor], Predictive]
    saved: Callable[[], tuple[tuple[torch.Tensor, torch.Tensor] | None, Any]]


class OneProcess:
    """The processes :func:`run` trains in by default: this one, on every training row.

    A strategy (this one, or the ranks of a data-parallel run, :class:`gpscale.run_parallel.Ranks`)
    provides ``is_main`` (the process that logs and writes), ``metrics`` (what it adds to
    ``metrics.json``), ``slowest(seconds)`` (the wall time over all processes) and
    ``train(spec, data, config, train, callbacks_for)``: build and train ``spec.method`` on
    ``train``, with the callbacks ``callbacks_for(predict)`` makes from a predictor
    ``predict(model, x_test)``, and return an :class:`Outcome`.
    """

    is_main = True
    metrics: dict[str, Any] = {}

    @staticmethod
    def slowest(seconds: float) -> float:
        return seconds

    @staticmethod
    def train(spec: RunSpec, data: Dataset, config: FitConfig,
              train: tuple[torch.Tensor, torch.Tensor],
              callbacks_for: Callable[[Callable[..., Predictive]], list],
              warm: dict[str, torch.Tensor] | None = None) -> Outcome:
        x, y = train
        callbacks = callbacks_for(lambda m, x_test: predict_test(m, x, y, x_test,
                                                                 cpu_fallback=False))
        trained = train_method(spec.method, train, task=data.task,
                               num_classes=data.num_classes, options=spec.options,
                               config=config, seed=spec.seed, callbacks=callbacks, warm=warm)
        model = trained.model
        trained_on = module_device(model)

        def saved() -> tuple[tuple[torch.Tensor, torch.Tensor], Any]:
            # a state conditioned on the GPU is kept unless prediction moved the model off it
            return (x, y), (trained.state if module_device(model) == trained_on else None)

        return Outcome(model, trained.history, trained.setup_time,
                       lambda x_test: predict_test(model, x, y, x_test, trained.state), saved)


def run(spec: RunSpec, processes: Any = None) -> RunResult:
    """Train and evaluate ``spec.method`` on the spec's data; see the module docstring.

    ``processes`` is the strategy to train in: :class:`OneProcess` (the default) or the ranks
    of a data-parallel run (:class:`gpscale.run_parallel.Ranks`); everything else — the data,
    the choice of ``auto``, the configuration, the metrics, the outputs — is the same.
    """
    processes = processes or OneProcess()
    data = load_data(spec)
    options = kernel_in_model_units(spec.options, transform=data.transform,
                                    names=(data.info or {}).get("columns"),
                                    num_dims=data.num_dims)
    spec = spec if options == spec.options else replace(spec, options=options)
    tic = time.perf_counter()
    chosen, warm, reason = resolve_auto(spec, data, getattr(processes, "agree", None),
                                parallel=not isinstance(processes, OneProcess),
                                race_limit=getattr(processes, "race_limit", None))
    choice_time = ({"auto_time_s": time.perf_counter() - tic, "method_reason": reason}
                   if reason is not None else {})
    spec = with_item_shape(chosen, data)
    config, dtype = fit_config(spec, data.num_train)
    latents = data.num_classes if (data.num_classes or 0) > 2 else 1
    if processes.is_main:
        logging.getLogger("gpscale.fit").info(plan_text(spec.method, config, spec.options,
                                                        data.num_train, latents, data.task))
    train = cast((data.x_train, data.y_train), config, data.task)
    x_test = data.x_test.to(dtype)

    def callbacks_for(predict: Callable[..., Predictive]) -> list:
        if not spec.eval_every:
            return []
        return [Evaluate(lambda m: predict(m, x_test), data.y_test, every=spec.eval_every)]

    try:
        outcome = processes.train(spec, data, config, train, callbacks_for, warm)
    except NonFiniteLossError as err:
        if processes.is_main:
            write_partial(spec, err.history)
        raise
    model, history = outcome.model, outcome.history
    tic = time.perf_counter()
    pred = outcome.predict(x_test)
    metrics: dict[str, Any] = {
        "method": spec.method, "dataset": data.name, "n_train": data.num_train,
        "n_test": data.num_test, "num_dims": data.num_dims, **pred.metrics(data.y_test),
        "setup_time_s": outcome.setup_time, "train_time_s": history.train_time,
        "epochs": history.epochs, "time_per_epoch_s": history.train_time / max(history.epochs, 1),
        "predict_time_s": processes.slowest(time.perf_counter() - tic),
        "stopped": history.stopped, "noise": _noise(pred), **choice_time, **processes.metrics,
    }
    metrics.update(_in_data_units(metrics, data))
    message = coverage_message(spec.method, metrics.get("test_coverage"), data.num_test,
                               history.stopped)
    if message is not None and processes.is_main:  # intervals the test rows contradict: said
        warnings.warn(message, CalibrationWarning, stacklevel=2)
    if spec.out is not None:
        rows, state = outcome.saved()  # a collective: every rank takes part
        if processes.is_main:
            write_outputs(spec, metrics, history, model, data, rows, state)
    return RunResult(metrics, history, model, data)


def run_metrics(spec: RunSpec) -> dict[str, Any]:
    """``run(spec).metrics``, or for a run that failed (NonFiniteLossError) a row saying so.

    For benchmark suites: a diverged run is a result, and the suite goes on with the next one.
    The failure row has ``dataset``, ``method``, ``epochs`` (completed) and ``stopped``.
    """
    try:
        return run(spec).metrics
    except NonFiniteLossError as err:
        log.warning("%s on %s stopped: %s", spec.method, spec.dataset, err)
        return {"dataset": spec.dataset, "method": spec.method, "epochs": err.epoch - 1,
                "stopped": f"failed in epoch {err.epoch}"}


def _in_data_units(metrics: dict[str, Any], data: Dataset) -> dict[str, float]:
    """The test RMSE in the target's own units (the other metrics are of standardised y)."""
    scale = getattr(data.transform, "y_std", None)
    if data.task != "regression" or scale is None or "test_rmse" not in metrics:
        return {}
    return {"test_rmse_data_units": metrics["test_rmse"] * float(scale)}


def _noise(pred: Predictive) -> float | None:
    return None if pred.noise is None else float(pred.noise.double().mean())


def write_outputs(spec: RunSpec, metrics: dict[str, Any], history: History, model: Method,
                  data: Dataset, train: tuple[torch.Tensor, torch.Tensor] | None,
                  state: Any = None) -> None:
    """Write ``metrics.json``, ``history.csv``, ``history.json`` and ``model.pt`` into
    ``spec.out`` as one set (:func:`gpscale.commit.write_together`): a reader finds all four of
    this run or all four of the one before, and ``metrics.json`` and ``model.pt``'s info carry
    the same ``run_id``."""
    run_id = new_run_id()
    text = json.dumps(json_safe({**metrics, "run_id": run_id}), indent=2, allow_nan=False)
    transform = None if data.transform is None else data.transform.to_dict()
    info = {"run_id": run_id, "spec": asdict(spec), "metrics": metrics, "dataset": data.name,
            "task": data.task, "num_classes": data.num_classes,
            "classes": data.info.get("classes"), "num_features": _raw_num_features(data),
            "feature_names": feature_names(data), "target_name": data.info.get("target"),
            "target_index": data.info.get("target_index"),
            "num_columns": data.info.get("num_columns")}
    # Methods whose state needs no data (SVGP, SOLVE-GP's minibatch bound) save none, methods
    # that summarise it (SoftKI's posterior, GGP's statistics) save the summary: model.pt's size
    # does not grow with n and it predicts without the training set. The rest keep the data.
    summary = None if state is None else model.summary(state)
    keep_data = model.needs_data_for_prediction and summary is None
    write_together(spec.out, run_id, {
        "model.pt": lambda path: save(model, path, data=train if keep_data else None,
                                      summary=summary, transform=transform, info=info),
        "metrics.json": lambda path: atomic_write(path, (text + "\n").encode()),
        "history.csv": history.to_csv,
        "history.json": history.to_json,
    })
    log.info("wrote %s", spec.out)


def write_partial(spec: RunSpec, history: History | None) -> None:
    """Write the histories of a run that failed into ``spec.out``, together; a ``model.pt``
    and ``metrics.json`` of an earlier run there stay as they were (and stay a pair)."""
    if spec.out is None or history is None:
        return
    write_together(spec.out, new_run_id(), {"history.csv": history.to_csv,
                                            "history.json": history.to_json})


def _raw_num_features(data: Dataset) -> int | None:
    """Columns of the raw inputs before constant columns were dropped (None if unknown)."""
    if data.transform is None:
        return data.num_dims
    return data.transform.num_input_dims


def feature_names(data: Dataset) -> list[str]:
    """Names of the raw input columns: the CSV header's (or the loader's), else x0..x{d-1}."""
    d = _raw_num_features(data) or data.num_dims
    names = data.info.get("columns")
    if names and data.info.get("header", True) and len(names) == d:
        return [str(name) for name in names]
    return [f"x{j}" for j in range(d)]
