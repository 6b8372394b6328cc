r"""What the training device holds and what keeps it busy: the minibatch of the minibatch
methods, the memory of the dense baselines, an out-of-memory error in one line.

**Minibatch.** The minibatch methods (SVGP, SOLVE-GP, SoftKI) train on minibatches of 1,024
(their papers' size) on the CPU. A GPU idles at that size: a step costs about the same at a much
larger batch, so a larger batch cuts an epoch's time by nearly its factor and, in the same time,
lowers the test error (evidence: docs/notes/benchmarks-2026-12.md, "Evidence moved out of the
code"). Both at each method's default learning rate: Adam's steps do not grow with the batch,
and the larger batch only lowers the gradient's noise, so the rate stays (the plateau schedule
lowers it where a smaller one serves). :func:`minibatch_size` gives a GPU the largest power of
two up to :data:`GPU_BATCH_SIZE` that leaves at least :data:`MIN_STEPS_PER_EPOCH` steps per
epoch, and never less than the CPU's batch: 16,384 from 524,288 points, 1,024 below 65,536.

**Inducing points.** The same card has room for more inducing points at nearly the same cost
per step: a step's time barely depends on the batch, while an inducing-point method's
arithmetic per step grows as batch · m², and with the CPU's sets SVGP and SOLVE-GP do not reach
the noise floor of a large low-dimensional field however long they train: the inducing set,
not the training, limits them. So on a GPU, for one latent function (regression),
:func:`inducing_options` sizes the sets a method declares (``MethodSpec.gpu_inducing``; why
each size, in its family's ``pipeline`` module). An option the user gives is never changed.

**Dense baselines.** The exact GP and GPyTorch's CG GP hold several n × n matrices at once; a
method declares how many (``MethodSpec.dense_copies``, the peak resident memory of
one loss with its backward and of one conditioning with a prediction).
:func:`check_dense_fits` refuses, before anything is built, a run whose matrices exceed the
device: the free memory of a GPU, the physical memory of the CPU (where the operating system
would swap or kill the process instead).

The tables these declarations replaced keep their names as read-only views of the registry:
``GPU_INDUCING`` and ``DENSE_COPIES`` (``{key: declared value}``). This module reads the
registry only inside its functions: the method families never import it.

**Out of memory later.** :func:`out_of_memory` turns torch's multi-line error into
:class:`~gpscale.errors.DeviceMemoryError`: one line naming the device, what ran out and what
to change. A trained model whose conditioning or test predictions do not fit on the GPU is not
lost: :func:`on_cpu_after_oom` warns, moves it to the CPU and computes them there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from gpscale.errors import DeviceMemoryError
from gpscale.limits import device_memory

__all__ = ["GPU_BATCH_SIZE", "MIN_STEPS_PER_EPOCH", "OOM_ERRORS", "check_dense_fits",
           "device_memory", "inducing_options", "minibatch_size", "on_cpu_after_oom",
           "out_of_memory", "PROCESS_ADVICE"]
# GPU_INDUCING, DENSE_COPIES and TRAINING_ADVICE are read from the registry when asked for
# (module __getattr__), so they are not in __all__.

GPU_BATCH_SIZE = 16_384
"""Largest default minibatch on a GPU (module docstring)."""
MIN_STEPS_PER_EPOCH = 32
"""A GPU's default minibatch leaves at least this many optimiser steps per epoch."""

OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
     torch.cuda.OutOfMemoryError})
"""torch's out-of-memory exceptions (``torch.OutOfMemoryError`` from 2.5, the CUDA one before)."""


def minibatch_size(batch_size: int, device: torch.device, num_train: int) -> int:
    """The default minibatch on ``device`` for a method whose CPU default is ``batch_size``:
    that on the CPU; on a GPU the largest power of two ≤ :data:`GPU_BATCH_SIZE` with at least
    :data:`MIN_STEPS_PER_EPOCH` steps per epoch over ``num_train`` points, at least
    ``batch_size``."""
    if device.type != "cuda":
        return batch_size
    size = GPU_BATCH_SIZE
    while size > batch_size and num_train < MIN_STEPS_PER_EPOCH * size:
        size //= 2
    return max(size, batch_size)


def _declared(method: str, name: str) -> Any:
    """What method key ``method`` declares as ``MethodSpec.<name>``; ``None`` for a key not
    registered."""
    from gpscale.methods.registry import METHODS

    spec = METHODS.get(method)
    return None if spec is None else getattr(spec, name)


def __getattr__(name: str) -> Any:
    """The declarations' former tables as read-only views (module docstring), and the advice
    that names the methods whose memory is linear in n."""
    if name in ("GPU_INDUCING", "DENSE_COPIES"):
        from gpscale.methods.registry import DeclaredTable

        return DeclaredTable(name.lower())
    if name == "TRAINING_ADVICE":
        return _training_advice()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _linear_memory() -> tuple[str, ...]:
    """The keys ``auto`` picks beyond the exact GP, whose memory is linear in n."""
    from gpscale.methods.auto import LINEAR_MEMORY

    return LINEAR_MEMORY


def _training_advice() -> str:
    return ("Use a smaller --batch-size or fewer inducing points or actions, train in "
            "float32, or choose a method whose memory is linear in n "
            f"({', '.join(_linear_memory())})")


def inducing_options(method: str, options: dict[str, Any], device: torch.device | None,
                     task: str, num_train: int) -> dict[str, Any]:
    """``options`` with the inducing sets ``method`` declares for a GPU
    (``MethodSpec.gpu_inducing``) filled in where it trains one latent function (regression)
    on a GPU and the user gave no size; otherwise ``options`` unchanged (module docstring)."""
    sizes = _declared(method, "gpu_inducing")
    if device is None or device.type != "cuda" or task != "regression" or not sizes:
        return options
    filled = dict(options)
    for name, (cap, divisor) in sizes.items():
        if filled.get(name) is None:
            filled[name] = max(1, min(cap, num_train // divisor))
    return filled


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def check_dense_fits(method: str, num_train: int, dtype: torch.dtype, device: torch.device,
                     memory: tuple[int, str] | None = None) -> None:
    """:class:`~gpscale.errors.DeviceMemoryError` before training when ``method``'s dense
    matrices (the ``MethodSpec.dense_copies`` it declares, of n × n) exceed ``memory`` (default
    :func:`device_memory`); nothing for the other methods."""
    copies = _declared(method, "dense_copies")
    if copies is None:
        return
    memory = device_memory(device) if memory is None else memory
    if memory is None:
        return
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = copies * itemsize * num_train**2
    if need > memory[0]:
        raise DeviceMemoryError(
            f"{method} on n = {num_train:,} points needs about {_gib(need)} ({copies:g} "
            f"{num_train:,} x {num_train:,} {str(dtype).removeprefix('torch.')} matrices) and "
            f"{_gib(memory[0])} is {memory[1]}; {_listed(_linear_memory())} need memory "
            "linear in n (--method auto picks one), or train on a subset")


def _listed(names: tuple[str, ...]) -> str:
    """``'a, b and c'``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# TRAINING_ADVICE (module __getattr__): what a run can change when a model's computation runs
# out of memory.
PROCESS_ADVICE = ("The memory this process may use (the machine's, or a limit set by ulimit or "
                  "a container) is too small for this step: free memory or raise the limit")
"""Where the failing step is not known to be the model's (reading files, start-up): no
training advice, which would blame settings that played no part."""


def out_of_memory(err: BaseException, where: str, device: torch.device | str | None,
                  kept: str = "", advice: str | None = None) -> DeviceMemoryError:
    """A one-line :class:`~gpscale.errors.DeviceMemoryError` for torch's ``err`` in
    ``where`` (e.g. "epoch 3"), saying what was ``kept`` and what to change (``advice``;
    ``None``: ``TRAINING_ADVICE``, what a run can change when a model's computation runs out of
    memory)."""
    advice = _training_advice() if advice is None else advice
    first = " ".join(str(err).split(". ")[0].split())[:200] or type(err).__name__
    place = f" on {device}" if device is not None else ""
    message = f"out of memory{place} in {where} ({first})"
    if kept:
        message += f"; {kept}"
    return DeviceMemoryError(f"{message}. {advice}")


def on_cpu_after_oom(compute: Callable[[torch.device], Any], model: torch.nn.Module,
                     what: str) -> Any:
    """``compute(device)`` on ``model``'s device; where a GPU runs out of memory, a warning
    naming ``what``, then ``model`` moves to the CPU and ``compute(cpu)`` runs there (its
    tensors must follow the device it is given). On the CPU torch's error is re-raised as a
    one-line :class:`~gpscale.errors.DeviceMemoryError`."""
    from gpscale.methods.base import module_device

    device = module_device(model)
    try:
        return compute(device)
    except OOM_ERRORS as err:
        if device.type == "cpu":
            raise out_of_memory(err, what, device) from None
        first = " ".join(str(err).split(". ")[0].split())[:200]
        warnings.warn(f"{what} ran out of memory on {device} ({first}); computing it on the "
                      "CPU instead (slower; the model stays on the CPU)", RuntimeWarning,
                      stacklevel=2)
    model.to("cpu")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        return compute(torch.device("cpu"))
    except OOM_ERRORS as err:
        raise out_of_memory(err, what, "cpu") from None
