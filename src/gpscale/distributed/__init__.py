"""Data-parallel training and inference on ``torch.distributed``.

Each rank (process) holds a contiguous shard of the training set; every loss term of the
supported methods is a sum over data points or a small dense matrix, so ranks compute their
pieces and all-reduce them. No home-made transport: gloo on CPU, NCCL on GPU.

Modules:

- :mod:`~gpscale.distributed.env` — process group from the torchrun variables (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR, MASTER_PORT), a timeout, :class:`DistributedError`; a single-process
  no-op fallback.
- :mod:`~gpscale.distributed.shard` — deterministic contiguous shards, per-rank minibatches.
- :mod:`~gpscale.distributed.reduce` — differentiable all-reduce / all-gather, gradient averaging,
  parameter broadcast, gathering predictions.
- :mod:`~gpscale.distributed.launch` — ``gpscale fit --nproc P``: P local processes.

This package is the infrastructure only. The sharded losses live beside their methods
(:mod:`gpscale.methods.cagp.sharded`: CaGP-Opt's ELBO from per-rank pieces;
:mod:`gpscale.methods.ski.sharded`: per-rank sufficient statistics, one all-reduce), the
``training.fit`` hook in :mod:`gpscale.training.parallel`, one rank of ``gpscale fit`` in
:mod:`gpscale.run_parallel` and the scaling benchmark in :mod:`gpscale.benchmarks.distributed`.

Supported methods: ``cagp-opt`` and ``ggp`` (full batch, loss and gradients equal the
single-process ones) and every ``minibatch=True`` method such as ``svgp``, ``solvegp``,
``softki`` (gradients averaged as ``DistributedDataParallel`` does; ``--batch-size`` is the
global batch, split over the ranks; for a loss that is a sum over points — SVGP, SOLVE-GP — a
step equals the step on the union of the ranks' batches, for SoftKI's batch marginal
likelihood it is the average of the ranks' batch losses).

One machine, P processes::

    gpscale fit --dataset protein --method cagp-opt --nproc 2 --out runs/protein-p2

Several machines (here 2 × 4 GPUs; run the same line on every machine with its own
``--node-rank``; ``--master-addr`` is machine 0's address, reachable from all of them)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 \\
        --master-addr 10.0.0.1 --master-port 29500 \\
        -m gpscale.cli fit --dataset protein --method cagp-opt --out runs/protein-p8

Under torchrun, ``gpscale fit`` sees ``WORLD_SIZE`` > 1 and runs as one rank (NCCL when CUDA is
available, else gloo). Rank 0 writes the outputs; ``--out`` and ``--checkpoint`` should be on a
file system every machine sees (a resumed run reads the checkpoint on every rank). Set
``GPSCALE_DIST_TIMEOUT`` (seconds, default 600) to change how long a rank waits for the others
before it stops with a ``DistributedError``.
"""

from gpscale.distributed.env import (
    DEFAULT_TIMEOUT,
    DistEnv,
    DistributedError,
    current,
    init_from_env,
    shutdown,
)
from gpscale.distributed.launch import launch
from gpscale.distributed.reduce import (
    all_gather_rows,
    all_reduce_sum,
    all_reduce_sums,
    barrier,
    broadcast_module,
    gather_predictive,
    reduce_gradients,
)
from gpscale.distributed.shard import rank_batches, shard_range, shard_rows, shard_sizes

__all__ = [
    "DEFAULT_TIMEOUT", "DistEnv", "DistributedError", "all_gather_rows", "all_reduce_sum",
    "all_reduce_sums", "barrier", "broadcast_module", "current", "gather_predictive",
    "init_from_env", "launch", "rank_batches", "reduce_gradients", "shard_range", "shard_rows",
    "shard_sizes", "shutdown",
]
