"""Where GGP's data-parallel statistics lived before the method families became packages; they
live in :mod:`gpscale.methods.ski.sharded` now, and this module re-exports its names so that
``gpscale.methods.ggp_sharded`` keeps working."""

from gpscale.methods.ski.sharded import (
    DEFAULT_CHUNK,
    ShardedGGPLoss,
    predict,
    reduce_statistics,
    shard_statistics,
    statistics,
)

__all__ = [
    "DEFAULT_CHUNK", "ShardedGGPLoss", "predict", "reduce_statistics", "shard_statistics",
    "statistics",
]
