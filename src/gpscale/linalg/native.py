"""Native CPU kernels: the block-sparse kernel product (CaGP-Opt's K S and its adjoint), the
dense product K V (:func:`dense_product`) and the same for a composed kernel, a sum of scaled
products of profiles on column groups (:func:`composed_product`).

The tile path (:func:`gpscale.linalg.operators.block_sparse.symmetric_kernel_product`) forms
each tile's kernel entries through ``torch`` operations: the backward pass evaluates every tile
twice and multiplies the tile's adjoint by the inputs in two more passes over 4 MB tiles, so
its backward costs several forwards, most of it in memory traffic. The C
functions in ``native_source.c`` instead walk each row against all columns in cache-sized
chunks and do all of a row's work (distances, profile, block reductions, and in the adjoint the
action and input gradients) in one pass, never storing a tile.

Each call handles a tile: a range of rows against a range of columns, and for a tile off the
diagonal of the symmetric product also its mirror image (each unordered pair evaluated once,
used for both rows). :func:`symmetric_rounds` orders the tiles in rounds whose tiles share no
row or column span, so a round runs in parallel without locks; the rectangular product takes
plain row ranges. Threads are Python threads (ctypes releases the GIL during the call), as many
as ``torch.get_num_threads()``; no OpenMP runtime is linked.

The library is compiled on first use with the system C compiler (``cc``, ``-O3 -march=native``
with reassociation) into a per-user cache keyed by the source, the compiler and the CPU's flags, and
loaded with ctypes. Where no compiler works, or ``GPSCALE_NATIVE=0`` is set, :func:`available`
is False, one warning says why, and callers keep the tile path.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["BLOCK_SPARSE_MAX_DIMS", "DENSE_MAX_DIMS", "PROFILE_IDS", "available",
           "block_sparse_forward", "composed_product", "dense_product", "kernel_matrix",
           "suits_block_sparse", "suits_dense", "symmetric_block_sparse_product",
           "symmetric_rounds"]

log = logging.getLogger(__name__)

PROFILE_IDS = {"rbf": 0, "matern12": 1, "matern32": 2, "matern52": 3}
_SOURCE = Path(__file__).with_name("native_source.c")
# Reassociation (vectorised sums) and no errno (vectorised sqrt), but not -ffast-math: linked
# into a shared library it sets the CPU's flush-to-zero mode for the whole process.
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
          "-fno-signed-zeros", "-fPIC", "-shared"]
_TYPES = {torch.float32: ("float", "f32", "exp_nonpositive_f32", "sqrtf"),
          torch.float64: ("double", "f64", "exp_nonpositive_f64", "sqrt")}
_ROWS_PER_TASK = 256  # rows per thread-pool task (dynamic balance on a shared machine)
_SPAN_BYTES = 256 * 1024
"""Bytes of right-hand sides per column span of :func:`dense_product` (the span's right-hand
sides and, in a mirrored tile, its outputs stay in L2 while all rows of the task pass)."""
BLOCK_SPARSE_MAX_DIMS = 256
"""Input dimensions up to which ``kernel_block_sparse_matmul``'s 'auto' takes the native row
kernels. Their distances cost O(d) per entry in scalar loops, the compiled tiles' a GEMM, so
the native kernels win at small d and the compiled ones at large d; this is where their forward
and backward of K S took about the same time."""
DENSE_MAX_DIMS = 384
"""Input dimensions up to which ``kernel_matmul``'s 'auto' takes :func:`dense_product`: its
distances cost O(d) per entry in scalar loops, the compiled tiles' a GEMM: native is faster
up to here and the compiled tiles beyond."""

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None
_pool: tuple[tuple[int, int], ThreadPoolExecutor] | None = None


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    if os.environ.get("GPSCALE_CACHE"):
        return Path(os.environ["GPSCALE_CACHE"]) / "native"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpscale" / "native"


def _source_text() -> str:
    text = _SOURCE.read_text()
    return "\n".join(
        f"#define REAL {real}\n#define SFX {sfx}\n#define EXP {exp}\n#define SQRT {sqrt}\n"
        f"{text}\n#undef REAL\n#undef SFX\n#undef EXP\n#undef SQRT\n"
        for real, sfx, exp, sqrt in _TYPES.values())


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler found (set CC or install gcc)")
    return compiler


def _build() -> ctypes.CDLL:
    compiler, source = _compiler(), _source_text()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    key = hashlib.sha256("\0".join([source, compiler, version, " ".join(_FLAGS),
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"blocksparse-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src, lib = Path(tmp) / "kernels.c", Path(tmp) / target.name
            src.write_text(source)
            done = subprocess.run([compiler, *_FLAGS, "-o", str(lib), str(src), "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
            os.replace(lib, target)  # atomic: concurrent processes see a whole library
    library = ctypes.CDLL(str(target))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for _, sfx, _, _ in _TYPES.values():
        forward = getattr(library, f"block_sparse_forward_{sfx}")
        forward.argtypes = [ctypes.c_int, i64, i64, ptr, ptr, ptr, ptr, ptr, i64, ptr, i64, i64,
                            i64, i64, ctypes.c_int]
        forward.restype = None
        adjoint = getattr(library, f"block_sparse_adjoint_{sfx}")
        adjoint.argtypes = [ctypes.c_int, i64, i64, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr,
                            ctypes.c_int, i64, i64, i64, i64, ctypes.c_int, ptr, ptr]
        adjoint.restype = None
        dense = getattr(library, f"dense_product_{sfx}")
        dense.argtypes = [ctypes.c_int, i64, i64, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64,
                          ctypes.c_int, i64]
        dense.restype = None
        composed = getattr(library, f"composed_product_{sfx}")
        composed.argtypes = [i64, ptr, ptr, ptr, *dense.argtypes[1:]]
        composed.restype = None
        getattr(library, f"vector_width_{sfx}").restype = ctypes.c_int
        rows = getattr(library, f"kernel_rows_{sfx}")
        rows.argtypes = [ctypes.c_int, i64, i64, ptr, ptr, i64, i64, ptr, i64]
        rows.restype = None
    return library


def _load() -> ctypes.CDLL | None:
    global _library, _failure
    with _lock:
        if _library is None and _failure is None:
            if os.environ.get("GPSCALE_NATIVE", "1") == "0":
                _failure = "disabled by GPSCALE_NATIVE=0"
            else:
                try:
                    _library = _build()
                except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                    _failure = str(exc)
                    warnings.warn(f"gpscale's native block-sparse kernels are unavailable "
                                  f"({_failure}); using the slower torch tile path",
                                  RuntimeWarning, stacklevel=3)
    return _library


def available(t: Tensor | None = None) -> bool:
    """Whether the native kernels can run (compiled here, and ``t`` a CPU float32/64 tensor)."""
    if t is not None and (t.device.type != "cpu" or t.dtype not in _TYPES):
        return False
    return _load() is not None


def suits_dense(x: Tensor) -> bool:
    """Whether 'auto' should run :func:`dense_product` for inputs ``x`` (..., n, d): the native
    kernels run here and d ≤ :data:`DENSE_MAX_DIMS`."""
    return x.shape[-1] <= DENSE_MAX_DIMS and available(x)


def suits_block_sparse(x: Tensor) -> bool:
    """Whether 'auto' should run the native block-sparse products for inputs ``x`` (..., n, d):
    the native kernels run here and d ≤ :data:`BLOCK_SPARSE_MAX_DIMS`."""
    return x.shape[-1] <= BLOCK_SPARSE_MAX_DIMS and available(x)


def _profile_id(profile: str) -> int:
    """The C functions' id of ``profile``; a ValueError naming the valid ones otherwise."""
    if profile not in PROFILE_IDS:
        raise ValueError(f"unknown profile {profile!r}; expected one of {sorted(PROFILE_IDS)}")
    return PROFILE_IDS[profile]


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _run(tasks: list[tuple], fn, threads: int | None = None) -> None:
    """``fn(*task)`` for every task, on ``threads`` (default ``torch.get_num_threads()``)
    threads; returns when all have finished."""
    global _pool
    threads = threads or _threads()
    if threads == 1 or len(tasks) == 1:
        for task in tasks:
            fn(*task)
        return
    with _lock:  # a new pool for another thread count, or in a forked child (no threads)
        if _pool is None or _pool[0] != (threads, os.getpid()):
            _pool = ((threads, os.getpid()),
                     ThreadPoolExecutor(threads, thread_name_prefix="gpscale-native"))
        pool = _pool[1]
    for future in [pool.submit(fn, *task) for task in tasks]:
        future.result()


def _row_tasks(num_rows: int, num_cols: int) -> list[tuple[int, int, int, int, int]]:
    """Row ranges against all columns, no mirroring: (r0, r1, 0, num_cols, 0)."""
    return [(r, min(r + _ROWS_PER_TASK, num_rows), 0, num_cols, 0)
            for r in range(0, num_rows, _ROWS_PER_TASK)]


def symmetric_rounds(n: int, threads: int) -> list[list[tuple[int, int, int, int, int]]]:
    """Rounds of tiles (r0, r1, c0, c1, mirror) covering every pair of the symmetric product
    once, no two tiles of a round sharing a row or a column span (so a round runs in parallel
    without locks): spans of about n / (8·threads) points; round 0 holds the diagonal tiles
    (ordered pairs, mirror 0), the others a round-robin pairing of the spans (circle method),
    each off-diagonal tile computed once and mirrored. Small n: one round of row ranges."""
    num_spans = 8 * threads
    if n < 2 * _ROWS_PER_TASK * num_spans:
        return [_row_tasks(n, n)]
    bounds = [k * n // num_spans for k in range(num_spans + 1)]  # none empty: n ≥ num_spans
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    rounds = [[(a0, a1, a0, a1, 0) for a0, a1 in spans]]
    ring = list(range(num_spans))  # num_spans is even: every round pairs all spans
    for _ in range(num_spans - 1):
        pairs = [(ring[k], ring[num_spans - 1 - k]) for k in range(num_spans // 2)]
        rounds.append([(*spans[min(a, b)], *spans[max(a, b)], 1) for a, b in pairs])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def _layout_arrays(layout, device) -> tuple[Tensor, Tensor]:
    sizes = torch.tensor(layout.sizes(), dtype=torch.int64, device=device)
    start = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    return start, layout.block_ids(device).to(torch.int64).contiguous()


def _fn(name: str, dtype: torch.dtype):
    return getattr(_load(), f"{name}_{_TYPES[dtype][1]}")


def block_sparse_forward(profile: str, rows: Tensor | None, z: Tensor, values: Tensor,
                         layout) -> Tensor:
    """Φ(rows, z) S, (t, i): rows (t, d), z (n, d) in block order, values (n,); no autograd.
    ``rows=None``: the symmetric product Φ(z, z) S, each off-diagonal tile computed once."""
    symmetric = rows is None
    rows = z if symmetric else rows
    rows, z, values = (t.detach().contiguous() for t in (rows, z, values))
    start, block_of = _layout_arrays(layout, z.device)
    zT = z.mT.contiguous()
    out = z.new_zeros(rows.shape[0], layout.num_blocks)
    forward = _fn("block_sparse_forward", z.dtype)
    pid, (n, d) = PROFILE_IDS[profile], z.shape

    def run(r0: int, r1: int, c0: int, c1: int, mirror: int) -> None:
        forward(pid, n, d, rows.data_ptr(), zT.data_ptr(), values.data_ptr(), start.data_ptr(),
                block_of.data_ptr(), layout.num_blocks, out.data_ptr(), r0, r1, c0, c1, mirror)

    rounds = symmetric_rounds(n, _threads()) if symmetric else [_row_tasks(rows.shape[0], n)]
    for tasks in rounds:
        _run(tasks, run)
    return out


class _Symmetric(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, values: Tensor, profile: str, layout):
        ctx.profile, ctx.layout = profile, layout
        ctx.save_for_backward(z, values)
        return block_sparse_forward(profile, None, z, values, layout)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        z, values = (t.contiguous() for t in ctx.saved_tensors)
        layout, (n, d) = ctx.layout, z.shape
        start, block_of = _layout_arrays(layout, z.device)
        zT, gout = z.mT.contiguous(), grad_out.contiguous()
        goutT = gout.mT.contiguous()
        grad_s, grad_z = torch.zeros_like(values), torch.zeros_like(z)
        want_z = int(ctx.needs_input_grad[0])
        adjoint, pid = _fn("block_sparse_adjoint", z.dtype), PROFILE_IDS[ctx.profile]

        def run(r0: int, r1: int, c0: int, c1: int, mirror: int) -> None:
            adjoint(pid, n, d, z.data_ptr(), zT.data_ptr(), values.data_ptr(), start.data_ptr(),
                    block_of.data_ptr(), layout.num_blocks, gout.data_ptr(), goutT.data_ptr(),
                    want_z, r0, r1, c0, c1, mirror, grad_s.data_ptr(), grad_z.data_ptr())

        for tasks in symmetric_rounds(n, _threads()):
            _run(tasks, run)
        return (grad_z if want_z else None), grad_s, None, None


def symmetric_block_sparse_product(profile: str, z: Tensor, values: Tensor, layout) -> Tensor:
    """Φ(z, z) S for block-sparse S, (n, i) in block order, differentiable in z and values.

    Same contract as :func:`gpscale.linalg.operators.block_sparse.symmetric_kernel_product`
    (whose ``exact`` option is moot here: distances are formed from differences).
    """
    _profile_id(profile)
    return _Symmetric.apply(z, values, profile, layout)


def dense_product(profile: str, z1: Tensor, z2: Tensor | None, rhs: Tensor) -> Tensor:
    """Φ(z1, z2) @ rhs, (t, k), for z1 (t, d), z2 (n, d), rhs (n, k) on the CPU; no autograd.

    One C function fills the kernel values of six rows against 256 columns at a time (distances
    from differences, so D² = 0 exactly on coincident points) into a panel that stays in L1, and
    multiplies it into ``rhs`` by register-blocked vector micro-kernels before the next panel:
    no tile is stored and no GEMM library is called. The right-hand sides are padded to a
    multiple of the CPU's vector width. ``z2=None`` means the symmetric product Φ(z1, z1) @ rhs:
    the tiles of :func:`symmetric_rounds` off the diagonal serve their rows and their columns,
    so each pair of distinct points outside the diagonal tiles is evaluated once. A rectangular
    product splits its rows among ``torch.get_num_threads()`` workers, or, with fewer rows than
    that takes, its columns (one output each, summed).
    """
    pid = _profile_id(profile)
    z1, z2, rhs = _dense_inputs("dense_product", z1, z2, rhs)
    product = _fn("dense_product", z1.dtype)
    return _panel_product(lambda *args: product(pid, *args), z1, z2, rhs)


def composed_product(terms: Sequence[tuple[float, Sequence[tuple[str, int]]]], z1: Tensor,
                     z2: Tensor | None, rhs: Tensor) -> Tensor:
    r"""K(z1, z2) @ rhs, (t, k), for a composed kernel on the CPU; no autograd.

    .. math::
        K(z_p, z_q) = \sum_t s_t \prod_{l \in t} φ_l\big(‖z_{p, c_l} − z_{q, c_l}‖²\big),

    ``terms`` lists (s_t, leaves) and each leaf (profile, width): the leaves' coordinate spans
    c_l follow one another in the order listed, so z1 (t, D) and z2 (n, D) hold each leaf's
    columns, already divided by its lengthscales, side by side (D the total width). The panels,
    threading, padding and ``z2=None`` (the symmetric product) are :func:`dense_product`'s;
    each panel entry is the sum over terms of the product of the leaves' profiles.

    Raises:
        ValueError: an unknown profile, widths not summing to D, a term without leaves, or
            inputs :func:`dense_product` would refuse.
    """
    leaves = [(_profile_id(profile), int(width)) for _, term in terms for profile, width in term]
    if any(len(term) == 0 for _, term in terms) or any(w < 1 for _, w in leaves) or (
            sum(w for _, w in leaves) != z1.shape[-1]):
        raise ValueError(f"composed_product needs terms of one or more leaves whose widths (≥ 1) "
                         f"sum to the inputs' {z1.shape[-1]} columns; got "
                         f"{[[w for _, w in term] for _, term in terms]}")
    z1, z2, rhs = _dense_inputs("composed_product", z1, z2, rhs)
    starts = [0, *itertools.accumulate(w for _, w in leaves)][:-1]
    leaf = torch.tensor([[pid, start, width] for (pid, width), start in zip(leaves, starts,
                                                                            strict=True)],
                        dtype=torch.int64)  # (L, 3): profile, first column, width
    term_end = torch.tensor(list(itertools.accumulate(len(term) for _, term in terms)),
                            dtype=torch.int64)
    scale = torch.tensor([float(s) for s, _ in terms], dtype=z1.dtype)
    product = _fn("composed_product", z1.dtype)

    def call(*args) -> None:
        product(len(terms), term_end.data_ptr(), scale.data_ptr(), leaf.data_ptr(), *args)

    return _panel_product(call, z1, z2, rhs)


def _dense_inputs(name: str, z1: Tensor, z2: Tensor | None,
                  rhs: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
    """z1, z2 and rhs checked (CPU float32/64 of one dtype, (t, d), (n, d), (n, k)) and detached;
    a ValueError naming ``name`` and the offending shapes or dtypes otherwise."""
    columns = z1 if z2 is None else z2
    if {rhs.dtype, columns.dtype} != {z1.dtype} or not available(z1):
        raise ValueError(f"{name} needs CPU float32 or float64 inputs of one dtype; got "
                         f"z1 {z1.dtype} on {z1.device}, rhs {rhs.dtype}")
    if z1.dim() != 2 or columns.dim() != 2 or columns.shape[1] != z1.shape[1] or (
            rhs.dim() != 2 or rhs.shape[0] != columns.shape[0]):
        raise ValueError(f"{name} needs z1 (t, d), z2 (n, d) and rhs (n, k); got z1 "
                         f"{tuple(z1.shape)}, z2 {tuple(columns.shape)}, rhs {tuple(rhs.shape)}")
    return z1.detach(), None if z2 is None else z2.detach(), rhs.detach()


def _panel_product(product, z1: Tensor, z2: Tensor | None, rhs: Tensor) -> Tensor:
    """The threading of :func:`dense_product` around ``product(n, d, z1, zT, rhs, kp, out, r0,
    r1, c0, c1, mirror, span)``, a C panel product (``panel_product`` in the C source)."""
    symmetric = z2 is None
    z1 = z1.contiguous()
    z2 = z1 if symmetric else z2.contiguous()
    zT, (t, d), (n, k) = z2.mT.contiguous(), z1.shape, rhs.shape
    if t == 0 or n == 0 or k == 0:
        return rhs.new_zeros(t, k)
    width = _fn("vector_width", z1.dtype)()
    padded = k if k == 1 or k % width == 0 else -(-k // width) * width
    rhs = rhs.contiguous() if padded == k else torch.nn.functional.pad(rhs, (0, padded - k))
    span = max(1, _SPAN_BYTES // (padded * rhs.element_size()))

    def run(out: Tensor, r0: int, r1: int, c0: int, c1: int, mirror: int) -> None:
        product(n, d, z1.data_ptr(), zT.data_ptr(), rhs.data_ptr(), padded, out.data_ptr(),
                r0, r1, c0, c1, mirror, span)

    threads = _threads()
    if symmetric or t >= _ROWS_PER_TASK * threads:  # one output, tasks disjoint in it
        out = rhs.new_zeros(t, padded)
        rounds = symmetric_rounds(n, threads) if symmetric else [_row_tasks(t, n)]
        for tasks in rounds:
            _run([(out, *task) for task in tasks], run, threads)
    else:  # few rows: column ranges, an output each
        bounds = [j * n // threads for j in range(threads + 1)]
        tasks = [(rhs.new_zeros(t, padded), 0, t, c0, c1, 0)
                 for c0, c1 in zip(bounds[:-1], bounds[1:], strict=True) if c1 > c0]
        _run(tasks, run, threads)
        out = tasks[0][0] if len(tasks) == 1 else torch.stack([task[0] for task in tasks]).sum(0)
    return out if padded == k else out[:, :k].contiguous()


def kernel_matrix(profile: str, z1: Tensor, z2: Tensor | None = None) -> Tensor:
    """Φ(z1, z2) as a (t, n) tensor for CPU float32/float64 inputs z1 (t, d), z2 (n, d)
    (``z2=None``: Φ(z1, z1)); no autograd. Row ranges on ``torch.get_num_threads()`` workers, each
    row filled in C against all columns in cache-sized chunks (distances from differences, so
    the diagonal of Φ(z, z) is exactly φ(0) in every dtype)."""
    _profile_id(profile)
    z2 = z1 if z2 is None else z2
    if z1.dtype != z2.dtype or not available(z1) or z1.dim() != 2 or z2.dim() != 2 or (
            z1.shape[1] != z2.shape[1]):
        raise ValueError(f"kernel_matrix needs CPU float32 or float64 inputs z1 (t, d), z2 (n, d) "
                         f"of one dtype; got {z1.dtype} {tuple(z1.shape)} on {z1.device}, "
                         f"{z2.dtype} {tuple(z2.shape)}")
    z1 = z1.detach().contiguous()
    zT, (t, d), n = z2.detach().mT.contiguous(), z1.shape, z2.shape[0]
    out = z1.new_empty(t, n)
    fill, pid = _fn("kernel_rows", z1.dtype), PROFILE_IDS[profile]

    def run(r0: int, r1: int, c0: int, c1: int, mirror: int) -> None:
        fill(pid, n, d, z1.data_ptr(), zT.data_ptr(), r0, r1, out[r0:].data_ptr(), n)

    if t and n:
        _run(_row_tasks(t, n), run)
    return out
