r"""What the training device holds and what keeps it busy: the minibatch of the minibatch
methods, the memory of the dense baselines, an out-of-memory error in one line.

**Minibatch.** svgp, solvegp and softki train on minibatches of 1,024 (their papers' size) on
the CPU. A GPU idles at that size: a step costs about the same at a much larger batch, so a
larger batch cuts an epoch's time by nearly its factor and, in the same time, lowers the test
error (evidence: docs/notes/benchmarks-2026-12.md, "Evidence moved out of the code"). Both at
each method's default learning rate: Adam's steps do not grow with the batch, and the larger
batch only lowers the gradient's noise, so the rate stays (the plateau schedule lowers it where a
smaller one serves). :func:`minibatch_size` gives a GPU the largest power of two up to
:data:`GPU_BATCH_SIZE` that leaves at least :data:`MIN_STEPS_PER_EPOCH` steps per epoch, and
never less than the CPU's batch: 16,384 from 524,288 points, 1,024 below 65,536.

**Inducing points.** The same card has room for more inducing points at nearly the same cost
per step: a step's time barely depends on the batch, while SVGP's and SOLVE-GP's arithmetic
per step grows as batch · m². With the CPU's sets (SVGP 512, SOLVE-GP 256 + 256) neither reaches
the noise floor of a large low-dimensional field however long it trains, at the GPU's batch as
at the CPU's: the inducing set, not the training, limits them. So on a GPU, for one latent
function (regression), :func:`inducing_options` sizes the sets by :data:`GPU_INDUCING`: SVGP
1,024 (the SVGP of the CaGP, SoftKI and SOLVE-GP papers, all run on GPUs), SOLVE-GP 512 + 512
(the same 1,024 basis functions; its paper's 1,024 + 1,024 took 1.5× SVGP-1,000's time per
step in its CIFAR-10 runs, and a larger set needs more epochs to converge). SoftKI keeps 512,
its paper's size on a GPU, which already comes close to the floor there. An option the user
gives is never changed.

**Dense baselines.** The exact GP and GPyTorch's CG GP hold several n × n matrices at once.
:data:`DENSE_COPIES` counts them, measured as the peak resident memory of one loss with its
backward and of one conditioning with a prediction (float64, n = 8,000, CPU;
``benchmarks/memory.peak_memory_mb``). :func:`check_dense_fits` refuses, before anything is
built, a run whose matrices exceed the device: the free memory of a GPU, the physical memory
of the CPU (where the operating system would swap or kill the process instead).

**Out of memory later.** :func:`out_of_memory` turns torch's multi-line error into
:class:`~gpscale.errors.DeviceMemoryError`: one line naming the device, what ran out and what
to change. A trained model whose conditioning or test predictions do not fit on the GPU is not
lost: :func:`on_cpu_after_oom` warns, moves it to the CPU and computes them there.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from gpscale.errors import DeviceMemoryError

__all__ = ["DENSE_COPIES", "GPU_BATCH_SIZE", "GPU_INDUCING", "MIN_STEPS_PER_EPOCH", "OOM_ERRORS",
           "check_dense_fits", "device_memory", "inducing_options", "minibatch_size",
           "on_cpu_after_oom", "out_of_memory", "PROCESS_ADVICE", "TRAINING_ADVICE"]

GPU_BATCH_SIZE = 16_384
"""Largest default minibatch on a GPU (module docstring)."""
MIN_STEPS_PER_EPOCH = 32
"""A GPU's default minibatch leaves at least this many optimiser steps per epoch."""

GPU_INDUCING: dict[str, dict[str, tuple[int, int]]] = {
    "svgp": {"num_inducing": (1024, 2)},
    "solvegp": {"num_inducing": (512, 4), "num_orthogonal": (512, 4)},
}
"""Default inducing sets on a GPU (module docstring): option → (cap, divisor), i.e.
min(cap, n / divisor) as the CPU's defaults are min(512, n/2) and min(256, n/4)."""

DENSE_COPIES = {"exact": 3.5, "cggp": 10.5}
"""n × n matrices of the training dtype each dense baseline holds at its peak (module
docstring): the larger of the peaks of a loss with its backward and of a conditioning with a
prediction, rounded up. The exact GP's peak is its loss's; cggp's too (GPyTorch's CG and
Lanczos on the dense matrix hold several copies)."""

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


def inducing_options(method: str, options: dict[str, Any], device: torch.device | None,
                     task: str, num_train: int) -> dict[str, Any]:
    """``options`` with the inducing sets of :data:`GPU_INDUCING` filled in where ``method``
    trains one latent function (regression) on a GPU and the user gave no size; otherwise
    ``options`` unchanged (module docstring)."""
    sizes = GPU_INDUCING.get(method)
    if device is None or device.type != "cuda" or task != "regression" or not sizes:
        return options
    filled = dict(options)
    for name, (cap, divisor) in sizes.items():
        if filled.get(name) is None:
            filled[name] = max(1, min(cap, num_train // divisor))
    return filled


def device_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes, what they are) that a run on ``device`` may use: a GPU's free memory (torch's
    cached blocks included), the CPU's physical memory; ``None`` where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        name = torch.cuda.get_device_name(device)
        return free + cached, f"free on {device} ({name})"
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of RAM on this machine"
    except (ValueError, OSError, AttributeError):
        return None


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def check_dense_fits(method: str, num_train: int, dtype: torch.dtype, device: torch.device,
                     memory: tuple[int, str] | None = None) -> None:
    """:class:`~gpscale.errors.DeviceMemoryError` before training when ``method``'s dense
    matrices (:data:`DENSE_COPIES` of n × n) exceed ``memory`` (default :func:`device_memory`);
    nothing for the other methods."""
    copies = DENSE_COPIES.get(method)
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
            f"{_gib(memory[0])} is {memory[1]}; cagp-opt, svgp, solvegp and softki need memory "
            "linear in n (--method auto picks one), or train on a subset")


TRAINING_ADVICE = ("Use a smaller --batch-size or fewer inducing points or actions, train in "
                   "float32, or choose a method whose memory is linear in n (cagp-opt, svgp, "
                   "solvegp, softki)")
"""What a run can change when a model's computation runs out of memory."""
PROCESS_ADVICE = ("The memory this process may use (the machine's, or a limit set by ulimit or "
                  "a container) is too small for this step: free memory or raise the limit")
"""Where the failing step is not known to be the model's (reading files, start-up): no
training advice, which would blame settings that played no part."""


def out_of_memory(err: BaseException, where: str, device: torch.device | str | None,
                  kept: str = "", advice: str = TRAINING_ADVICE) -> DeviceMemoryError:
    """A one-line :class:`~gpscale.errors.DeviceMemoryError` for torch's ``err`` in
    ``where`` (e.g. "epoch 3"), saying what was ``kept`` and what to change (``advice``)."""
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
