"""Benchmark ``kernels``: matrix-free kernel-product throughput and memory.

(a) Throughput of ``K(x, x) @ V`` (forward, no grad) for a Matérn-3/2 ARD kernel with output
scale, n = 20,000, d = 8, 64 right-hand sides, float32, per backend ('eager', 'fused',
'compiled', 'native' where it builds, 'keops' when pykeops is installed), for the naive dense
reference ``kernel_matrix(kernel, x, x) @ V``, and for ``K @ V`` with K formed beforehand
('stored K (GEMM only)': the same product's GEMM with the kernel entries free, the bound a
matrix-free product can approach). The roofline is this machine's fp32 GEMM rate measured in
the same process: a kernel entry needs at least the 2d flops of its inner product (the distance
expansion) and the 2k flops of its share of ``K @ V``, so

    roofline [entries/s] = GEMM [flop/s] / (2 (k + d)).

(b) Peak extra resident memory of forward + backward of ``kernel_matmul`` (gradients for x, V
and the hyperparameters) at n = 40,000 in a fresh process (:func:`peak_memory_mb`), next to the
n² float32 entries a dense kernel matrix would need.

(c) CaGP-Opt's training product K S for block-sparse actions at Protein's size (n = 41,157,
d = 9, i = 512, float32), forward and backward, for the native row kernels
(:mod:`gpscale.linalg.native`) and the compiled tiles: the product an epoch is made of.

(d) A composed kernel, a sum of two stationary kernels on halves of the inputs
(:data:`COMPOSED`), against one kernel on all of them, n = 20,000, forward and forward +
backward, side by side (:func:`_composed_rows`): the composed product's native forward, its
compiled tiles and GPyTorch's composition next to the single kernel's native and compiled
products.

``quick=True`` shrinks n (2,000 and 4,000) for a smoke test. Times are the best of 3 runs
after one warm-up run (the warm-up includes ``torch.compile``); the GEMM rate is the best of
all GEMM runs, interleaved with the products (the machine may be shared).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from gpscale.benchmarks.memory import peak_memory_mb
from gpscale.kernels import build_kernel, composed_terms, kernel_matmul, kernel_matrix, make_kernel
from gpscale.linalg import native
from gpscale.linalg.composed import composed_matmul
from gpscale.linalg.fused import wait_for_compilation
from gpscale.linalg.operators.block_sparse import BlockLayout, symmetric_kernel_product
from gpscale.report import write_results

__all__ = ["gemm_gflops", "run"]

log = logging.getLogger(__name__)

NUM_DIMS, NUM_RHS, DTYPE = 8, 64, torch.float32
COLUMNS = ["measure", "backend", "n", "seconds", "entries_per_s", "fraction_of_roofline",
           "gemm_gflops", "roofline_entries_per_s", "peak_mb", "dense_kernel_mb", "ratio"]
GPU_COLUMNS = ["measure", "backend", "device", "n", "seconds", "backward_s", "entries_per_s",
               "fraction_of_roofline", "max_rel_error", "gemm_gflops",
               "roofline_entries_per_s", "note"]


def gemm_gflops(size: int = 2048, repeats: int = 3) -> float:
    """Best fp32 GEMM rate of this process over ``repeats`` runs, GFLOP/s (size × size)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, dtype=DTYPE) for _ in range(2))
    return 2 * size**3 / _best_seconds(lambda: a @ b, repeats) / 1e9


def _best_seconds(fn: Callable[[], Any], repeats: int, *, warmup: bool = True) -> float:
    if warmup:
        fn()  # compilation, caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _problem(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kernel = make_kernel("matern32", NUM_DIMS).to(DTYPE)
    kernel.base_kernel.lengthscale = 0.5 + torch.rand(1, NUM_DIMS, generator=g)
    kernel.outputscale = 1.3
    x = torch.randn(n, NUM_DIMS, generator=g, dtype=DTYPE)
    rhs = torch.randn(n, NUM_RHS, generator=g, dtype=DTYPE)
    return kernel, x, rhs


def _backends() -> list[str]:
    found = ["eager", "fused", "compiled"] + (["native"] if native.available() else [])
    return found + ["keops"] if importlib.util.find_spec("pykeops") is not None else found


def _throughput_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    """Best-of-``repeats`` times per backend; the GEMM rate is re-measured between runs (the
    machine may be shared) and its best value sets the roofline."""
    kernel, x, rhs = _problem(n)
    products: dict[str, Callable[[], Any]] = {
        name: (lambda name=name: kernel_matmul(kernel, x, x, rhs, backend=name))
        for name in _backends()
    }
    products["dense reference"] = lambda: kernel_matrix(kernel, x, x) @ rhs
    with torch.no_grad():
        stored = kernel_matrix(kernel, x, x)
    products["stored K (GEMM only)"] = lambda: stored @ rhs  # the bound: kernel entries free
    seconds, gflops = {}, gemm_gflops()
    with torch.no_grad():
        for name, product in products.items():
            log.info("kernels: throughput of %s at n=%d", name, n)
            product()  # warm-up; the compiled tiles compile ahead in a child process:
            wait_for_compilation()  # measure them compiled, not their uncompiled stand-in
            seconds[name] = float("inf")
            for _ in range(repeats):
                seconds[name] = min(seconds[name], _best_seconds(product, 1, warmup=False))
                gflops = max(gflops, gemm_gflops())
    roofline = gflops * 1e9 / (2 * (NUM_RHS + NUM_DIMS))
    return [{"measure": "throughput", "backend": name, "n": n, "seconds": t,
             "entries_per_s": n * n / t, "fraction_of_roofline": n * n / t / roofline,
             "gemm_gflops": gflops, "roofline_entries_per_s": roofline}
            for name, t in seconds.items()]


def forward_backward(n: int, backend: str) -> float:
    """Forward and backward of ``kernel_matmul`` at size n; returns the seconds it took."""
    kernel, x, rhs = _problem(n)
    x.requires_grad_()
    rhs.requires_grad_()
    start = time.perf_counter()
    out = kernel_matmul(kernel, x, x, rhs, backend=backend)
    out.square().sum().backward()
    return time.perf_counter() - start


def _memory_rows(n: int) -> list[dict[str, Any]]:
    dense_mb = n * n * torch.finfo(DTYPE).bits / 8 / 2**20
    rows = []
    for backend in ("compiled", "eager"):
        log.info("kernels: peak memory of %s forward+backward at n=%d", backend, n)
        peak, seconds = peak_memory_mb(forward_backward, n, backend)
        rows.append({"measure": "memory (fwd+bwd)", "backend": backend, "n": n,
                     "seconds": seconds, "peak_mb": peak, "dense_kernel_mb": dense_mb})
    return rows


PROTEIN_N, BLOCK_DIMS, BLOCK_ACTIONS = 41_157, 9, 512  # Protein's training set, CaGP's i


def _block_sparse_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    """Forward and backward of the symmetric block-sparse product per backend (best of
    ``repeats`` after a warm-up, which compiles)."""
    g = torch.Generator().manual_seed(0)
    layout = BlockLayout(n, BLOCK_ACTIONS)
    z = 0.7 * torch.randn(n, BLOCK_DIMS, generator=g, dtype=DTYPE)
    values = torch.randn(n, generator=g, dtype=DTYPE)
    products = {"compiled": lambda a, b: symmetric_kernel_product("matern32", a, b, layout,
                                                                  compiled=True)}
    if native.available(z):
        products["native"] = lambda a, b: native.symmetric_block_sparse_product(
            "matern32", a, b, layout)
    rows = []
    for name, product in products.items():
        log.info("kernels: block-sparse product, %s, n=%d", name, n)
        best = {"forward": float("inf"), "backward": float("inf")}
        for run in range(repeats + 1):  # the first run warms up (compilation)
            if run == 1:
                wait_for_compilation()
            a, b = z.clone().requires_grad_(), values.clone().requires_grad_()
            start = time.perf_counter()
            out = product(a, b)
            middle = time.perf_counter()
            out.backward(torch.ones_like(out))
            end = time.perf_counter()
            best = {"forward": min(best["forward"], middle - start),
                    "backward": min(best["backward"], end - middle)}
        rows += [{"measure": f"block-sparse {part}", "backend": name, "n": n, "seconds": t,
                  "entries_per_s": n * n / t} for part, t in best.items()]
    return rows


COMPOSED = "matern32(0:4) + rbf(4:8)"
"""The composed row's kernel: a sum of two stationary kernels on halves of the inputs."""


def _composed_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    """A sum of two stationary kernels (:data:`COMPOSED`) against one kernel on all the inputs,
    side by side in one loop (forward, and forward + backward with gradients for the inputs,
    right-hand sides and hyperparameters): the composed product by 'auto' (its forward in C,
    :func:`gpscale.linalg.native.composed_product`, where the native kernels build), by its
    compiled tiles, and through GPyTorch's composition ('eager'); the single kernel by 'native'
    (where it builds: forward :func:`~gpscale.linalg.native.dense_product`, with gradients the
    compiled tiles) and by 'compiled'. ``ratio`` is each time over the single kernel's fastest,
    in the forward the native one: 'composed (auto)' there is native composed over native
    single."""
    single, x, rhs = _problem(n)
    composed = build_kernel(COMPOSED, NUM_DIMS).to(DTYPE)

    def tiles(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return composed_matmul(composed_terms(composed), a, a, v, native_forward=False)

    runs: dict[str, tuple[Any, Callable[..., torch.Tensor]]] = {
        name: (kernel, partial(_self_product, kernel, backend))
        for name, kernel, backend in [("composed (auto)", composed, "auto"),
                                      ("composed (eager)", composed, "eager"),
                                      ("single (native)", single, "native"),
                                      ("single (compiled)", single, "compiled")]
        if backend != "native" or native.available(x)}
    runs["composed (compiled tiles)"] = (composed, tiles)
    best = {(name, part): float("inf") for name in runs for part in ("forward", "fwd+bwd")}
    for rep in range(repeats + 1):  # the first round warms up (compilation)
        if rep == 1:
            wait_for_compilation()
        for name, (kernel, product) in runs.items():
            log.info("kernels: composed row, %s, n=%d", name, n)
            with torch.no_grad():
                start = time.perf_counter()
                product(x, rhs)
                forward = time.perf_counter() - start
            a, v = x.clone().requires_grad_(), rhs.clone().requires_grad_()
            start = time.perf_counter()
            product(a, v).square().sum().backward()
            both = time.perf_counter() - start
            kernel.zero_grad()
            if rep:
                best[name, "forward"] = min(best[name, "forward"], forward)
                best[name, "fwd+bwd"] = min(best[name, "fwd+bwd"], both)
    rows = []
    for part in ("forward", "fwd+bwd"):
        fastest = min(best[name, part] for name in runs if name.startswith("single"))
        rows += [{"measure": f"composed {part}", "backend": name, "n": n,
                  "seconds": best[name, part], "entries_per_s": n * n / best[name, part],
                  "ratio": best[name, part] / fastest} for name in runs]
    return rows


def _self_product(kernel, backend: str, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return kernel_matmul(kernel, x, x, v, backend=backend)


def run(out_dir: Path | str, *, quick: bool = False, device: str | None = None,
        runs: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Measure throughput (a) and memory (b); write ``report.md`` etc. into ``out_dir``.

    Args:
        out_dir: output folder.
        quick: small sizes for a smoke test.
        device: ``"cuda"`` (``"cuda:N"``) measures the GPU's product instead
            (:mod:`gpscale.benchmarks.kernels_gpu`); ``None`` or ``"cpu"`` this module's.
        runs: on a GPU, the backends to measure (``triton``, ``compiled``, ``keops``,
            ``loop``; default all that run there).

    Returns:
        The result rows (also written to ``results.csv`` / ``results.jsonl``).
    """
    if device not in (None, "cpu"):
        return _run_gpu(out_dir, quick, device, runs)
    if runs:
        raise ValueError("--runs chooses backends on a GPU only (--device cuda)")
    # Memory first: the child process's peak RSS counts the parent's RSS at fork time (Linux
    # keeps ru_maxrss across exec), so the parent must not yet hold the dense reference's pages.
    memory = _memory_rows(4_000 if quick else 40_000)
    rows = _throughput_rows(2_000 if quick else 20_000, repeats=1 if quick else 3) + memory
    rows += _block_sparse_rows(3_000 if quick else PROTEIN_N, repeats=1 if quick else 3)
    rows += _composed_rows(2_000 if quick else 20_000, repeats=1 if quick else 3)
    notes = (f"Matérn-3/2 ARD with output scale, d = {NUM_DIMS}, k = {NUM_RHS} right-hand sides, "
             "float32, default chunk sizes, torch threads as listed above. roofline = GEMM "
             "flop/s / (2 (k + d)) kernel entries per second (inner product and product "
             "flops per entry, measured fp32 GEMM rate). Memory: peak extra RSS of a fresh "
             "process running forward + backward (incl. inputs, gradients and, for "
             "'compiled', the torch.compile runtime), versus n² float32 entries of a dense "
             "kernel matrix. Block-sparse: CaGP-Opt's training product K S (i = "
             f"{BLOCK_ACTIONS} block-sparse actions, d = {BLOCK_DIMS}) forward and backward, "
             "the native row kernels against the compiled tiles; pairs/s = n² / seconds.")
    write_results(out_dir, "kernels", rows, columns=COLUMNS, notes=notes)
    return rows


def _run_gpu(out_dir: Path | str, quick: bool, device: str,
             runs: tuple[str, ...] | None) -> list[dict[str, Any]]:
    from gpscale.benchmarks import kernels_gpu
    from gpscale.training import FitConfig

    rows = kernels_gpu.gpu_rows(FitConfig(device=device).torch_device, quick=quick,
                                backends=runs)
    notes = (f"One GPU (the device column). Matérn-3/2 ARD with output scale, d = "
             f"{kernels_gpu.NUM_DIMS}, k = {kernels_gpu.NUM_RHS}, float32, no gradient; "
             "backward_s: the backward of (K V).square().sum() for x, V and the kernel's "
             "hyperparameters. roofline = fp32 GEMM flop/s (TF32 off, same process) / "
             "(2 (k + d)). max_rel_error: max |Y - Y64| / max |Y64| over the first "
             f"{kernels_gpu.CHECK_ROWS} rows against float64. The hand-written loop: "
             "torch.cdist on 8,192-row chunks, the Matérn profile, @ V.")
    write_results(out_dir, "kernels", rows, columns=GPU_COLUMNS, notes=notes)
    return rows
