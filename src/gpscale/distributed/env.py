"""Process-group set-up from the ``torchrun`` environment, with a timeout and a clear error.

``init_from_env()`` reads the variables ``torchrun`` (and :func:`gpscale.distributed.launch`)
set — ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` — and starts
``torch.distributed`` with gloo on CPU or NCCL on CUDA. Without ``WORLD_SIZE`` (or with
``WORLD_SIZE=1``) it starts nothing: every helper in this package is then a no-op and a script
runs unchanged in one process.

Every collective of :mod:`gpscale.distributed.reduce` runs inside :func:`collective`, which turns
the backend's failure (a peer closed its connection, or nothing arrived within ``timeout``) into
a :class:`DistributedError` naming this rank, the collective and the timeout, so a dead rank
stops the others with a readable message rather than a hang. On NCCL the timeout is enforced by
PyTorch's watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default), which aborts the process.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT", "DistEnv", "DistributedError", "RankInputError", "collective", "current",
    "init_from_env", "shutdown",
]

DEFAULT_TIMEOUT = 600.0
"""Seconds a collective (and the rendezvous) waits for the other ranks before failing."""

BACKENDS = ("gloo", "nccl")


class DistributedError(RuntimeError):
    """A collective failed: another rank died, or did not answer within the timeout."""


class RankInputError(DistributedError, ValueError):
    """The first rank to fail rejected its input (a ``ValueError``): the same bad input on
    every rank, reported as that one error rather than as a failed job."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the job.

    Attributes:
        rank: global rank in 0 … world_size − 1.
        world_size: P, the number of processes.
        local_rank: rank on this machine (selects the GPU).
        backend: ``'gloo'``, ``'nccl'`` or ``None`` for a single process without a group.
        device: the device this rank computes on.
        timeout: seconds a collective waits before raising :class:`DistributedError`.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")
    timeout: float = DEFAULT_TIMEOUT

    @property
    def is_main(self) -> bool:
        """Rank 0 writes outputs, checkpoints and progress."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """A process group with more than one rank is running."""
        return self.backend is not None and self.world_size > 1


_ENV = DistEnv()


def current() -> DistEnv:
    """The environment set by the last :func:`init_from_env` (a single process before that)."""
    return _ENV


def _int_var(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"the torchrun environment variable {name} is not set; launch with "
                             "`torchrun` or `gpscale fit --nproc P`")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {raw!r}") from None


def init_from_env(*, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                  device: str | torch.device | None = None) -> DistEnv:
    """Join the process group described by the torchrun environment variables.

    Args:
        backend: ``'gloo'`` or ``'nccl'``; default NCCL when ``device`` is CUDA, else gloo.
        timeout: seconds the rendezvous and each collective wait for the other ranks.
        device: this rank's device; default ``cuda:LOCAL_RANK`` when CUDA is available and the
            backend is NCCL, else CPU.

    Returns:
        The :class:`DistEnv` (also returned by :func:`current` afterwards). With ``WORLD_SIZE``
        unset or 1, a single-process environment and no process group.

    Raises:
        ValueError: missing or malformed variables, RANK outside 0 … WORLD_SIZE − 1, an unknown
            backend, or a non-positive timeout.
        DistributedError: the other ranks did not join within ``timeout``.
    """
    global _ENV
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds; got {timeout}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    world_size = _int_var("WORLD_SIZE", 1)
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE must be at least 1; got {world_size}")
    if world_size == 1:
        _ENV = DistEnv(device=torch.device(device or "cpu"), timeout=timeout)
        return _ENV
    rank, local_rank = _int_var("RANK"), _int_var("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK must lie in 0 … {world_size - 1}; got {rank}")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ValueError(f"the torchrun environment variable {name} is not set")
    dev = _device(backend, device, local_rank)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError("the NCCL backend needs a CUDA device; use backend='gloo' on CPU")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
        except (RuntimeError, dist.DistError) as err:
            raise DistributedError(
                f"rank {rank}/{world_size}: the rendezvous at {os.environ['MASTER_ADDR']}:"
                f"{os.environ['MASTER_PORT']} failed or timed out after {timeout:g} s: {err}"
            ) from err
    _ENV = DistEnv(rank, world_size, local_rank, backend, dev, timeout)
    return _ENV


def _device(backend: str | None, device: str | torch.device | None, local_rank: int):
    if device is not None:
        return torch.device(device)
    if backend != "gloo" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def shutdown() -> None:
    """Leave the process group (if any) and return to the single-process environment."""
    global _ENV
    if dist.is_initialized():
        dist.destroy_process_group()
    _ENV = DistEnv()


@contextlib.contextmanager
def collective(name: str) -> Iterator[DistEnv]:
    """Run a collective; a backend failure becomes :class:`DistributedError` with context."""
    env = _ENV
    try:
        yield env
    except DistributedError:
        raise
    except (RuntimeError, dist.DistError) as err:
        raise DistributedError(
            f"rank {env.rank}/{env.world_size}: {name} failed — another rank probably died or "
            f"did not respond within the {env.timeout:g} s timeout ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''})") from err
