"""``gpscale bench kernels --device cuda``: the kernel product on a GPU (issue #43).

K(X, X) V for a Matérn-3/2 ARD kernel with output scale, n = 200,000, d = 8, k = 64, float32,
on one GPU, per backend of ``kernel_matmul`` that runs there ('triton', 'compiled', 'keops'
where pykeops is installed; GPyTorch's 'eager' path, 0.02 of the roofline on an H100, is left
out for the device time), next to a hand-written loop: ``torch.cdist`` on row
chunks of 8,192, the Matérn profile and ``@ V``, what a user writes without this library.

Each row names the card. Columns:

- ``seconds``: the forward without gradients, best of 3 after a warm-up (which compiles), timed
  between ``torch.cuda.synchronize()`` calls; ``backward_s`` the backward of
  ``(K V).square().sum()`` for x, V, the lengthscales and the output scale (best of 3).
- ``fraction_of_roofline``: entries per second against GEMM / (2 (k + d)), GEMM the card's
  fp32 rate measured in the same process with TF32 off (the kernel needs IEEE fp32 products
  for GP solves, so TF32's rate is not the bar).
- ``max_rel_error``: max |Y − Y₆₄| / max |Y₆₄| over the first 2,048 rows, Y₆₄ the product in
  float64 (the 'fused' tiles on float64 inputs).

Block-sparse rows: CaGP-Opt's training product K S at Protein's size (n = 41,157, d = 9,
i = 512 block-sparse actions, float32), forward and backward, the Triton kernels against the
compiled PyTorch tiles.

``quick=True``: n = 20,000 (block-sparse: 4,000).
"""

from __future__ import annotations

import importlib.util
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from gpscale.devices import OOM_ERRORS
from gpscale.kernels import kernel_matmul, make_kernel
from gpscale.linalg import triton as triton_kernels

__all__ = ["block_sparse_rows", "gpu_rows", "handwritten_loop", "sweep"]

log = logging.getLogger(__name__)

NUM_DIMS, NUM_RHS, N, QUICK_N, CHECK_ROWS = 8, 64, 200_000, 20_000, 2_048


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _seconds(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs after one warm-up, synchronised."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def gemm_tflops(device: torch.device, size: int = 8192) -> float:
    """The card's fp32 GEMM rate with TF32 off, TFLOP/s."""
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, device=device, dtype=torch.float32)
            for _ in range(2))
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return 2 * size**3 / _seconds(lambda: a @ b, device) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def handwritten_loop(lengthscale: torch.Tensor, outputscale: torch.Tensor, x: torch.Tensor,
                     v: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """K V as a user writes it without this library: cdist on row chunks, Matérn-3/2, ``@ V``."""
    z = x / lengthscale
    out = []
    for start in range(0, z.shape[0], chunk):
        r = 3**0.5 * torch.cdist(z[start:start + chunk], z)
        out.append(((1 + r) * torch.exp(-r)) @ v)
    return outputscale * torch.cat(out)


def _problem(n: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    kernel = make_kernel("matern32", NUM_DIMS)
    kernel.base_kernel.lengthscale = 0.5 + torch.rand(1, NUM_DIMS, generator=g,
                                                      dtype=torch.float64)
    kernel.outputscale = 1.3
    x = torch.randn(n, NUM_DIMS, generator=g, dtype=torch.float64)
    v = torch.randn(n, NUM_RHS, generator=g, dtype=torch.float64)
    return kernel.to(device), x.to(device), v.to(device)


def _float32_problem(n: int, device: torch.device):
    """The float32 kernel, inputs and right-hand sides, and the float64 product of the first
    :data:`CHECK_ROWS` rows (the accuracy reference)."""
    kernel64, x64, v64 = _problem(n, device)
    kernel = make_kernel("matern32", NUM_DIMS).to(device=device, dtype=torch.float32)
    kernel.load_state_dict(kernel64.state_dict())
    with torch.no_grad():
        reference = kernel_matmul(kernel64, x64[:CHECK_ROWS], x64, v64, backend="fused")
    return kernel, x64.float(), v64.float(), reference


BACKENDS = ("triton", "compiled", "keops", "loop")
"""What :func:`gpu_rows` can measure (``loop``: :func:`handwritten_loop`)."""


def gpu_rows(device: torch.device, *, quick: bool = False, n: int | None = None,
             gemm_size: int = 8192, backends=None) -> list[dict[str, Any]]:
    """The rows of the module docstring on ``device`` (n points: :data:`N`, or
    :data:`QUICK_N` with ``quick``; any device, so that the CPU can check the code), for
    ``backends`` (a subset of :data:`BACKENDS`; default all that run there)."""
    backends = tuple(backends or BACKENDS)
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"unknown kernel backends {sorted(unknown)}; choose from {BACKENDS}")
    n = n or (QUICK_N if quick else N)
    kernel, x, v, reference = _float32_problem(n, device)
    products: dict[str, Callable[..., torch.Tensor]] = {
        name: (lambda a, b, name=name: kernel_matmul(kernel, a, a, b, backend=name))
        for name in ("triton", "compiled", "keops") if name in backends
        and (name != "triton" or triton_kernels.available(x))
        and (name != "keops" or importlib.util.find_spec("pykeops") is not None)}
    if "loop" in backends:
        products["hand-written loop (cdist)"] = lambda a, b: handwritten_loop(
            kernel.base_kernel.lengthscale, kernel.outputscale, a, b)
    tflops = gemm_tflops(device, gemm_size)
    roofline = tflops * 1e12 / (2 * (NUM_RHS + NUM_DIMS))
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    rows = []
    for name, product in products.items():
        log.info("kernels (%s): %s at n=%d", card, name, n)
        row = {"measure": "throughput", "backend": name, "device": card, "n": n,
               "gemm_gflops": tflops * 1e3, "roofline_entries_per_s": roofline}
        rows.append(row)
        try:
            with torch.no_grad():
                seconds = _seconds(lambda product=product: product(x, v), device)
                error = ((product(x, v)[:CHECK_ROWS].double() - reference).abs().max()
                         / reference.abs().max()).item()
        except OOM_ERRORS:
            row["note"] = "forward: out of memory"
            _empty_cache(device)
            continue
        row.update(seconds=seconds, entries_per_s=n * n / seconds,
                   fraction_of_roofline=n * n / seconds / roofline, max_rel_error=error)

        def backward(product=product):
            a, b = x.clone().requires_grad_(), v.clone().requires_grad_()
            out = product(a, b).square().sum()
            _sync(device)
            tic = time.perf_counter()
            out.backward()
            _sync(device)
            return time.perf_counter() - tic

        try:
            backward()  # warm-up (compiles the backward)
            row["backward_s"] = min(backward() for _ in range(3))
        except OOM_ERRORS:  # autograd through the loop keeps every chunk's matrices
            row["note"] = "backward: out of memory"
            _empty_cache(device)
        kernel.zero_grad(set_to_none=True)
    block_n = n if n < QUICK_N else 4_000 if quick else 41_157  # small n: a check of the code
    if "compiled" not in backends:  # the block-sparse rows compare against it
        return rows
    return rows + block_sparse_rows(device, n=block_n, num_blocks=min(512, block_n // 8))


def block_sparse_rows(device: torch.device, n: int = 41_157, d: int = 9,
                      num_blocks: int = 512) -> list[dict[str, Any]]:
    """Forward and backward of the symmetric block-sparse product, Triton and compiled tiles
    (best of 3 after a warm-up that compiles)."""
    from gpscale.linalg.operators.block_sparse import BlockLayout, symmetric_kernel_product

    g = torch.Generator().manual_seed(0)
    layout = BlockLayout(n, num_blocks)
    z = (0.7 * torch.randn(n, d, generator=g)).to(device)
    values = torch.randn(n, generator=g).to(device)
    products = {"compiled": lambda a, b: symmetric_kernel_product("matern32", a, b, layout,
                                                                  compiled=True)}
    if triton_kernels.available(z):
        products["triton"] = lambda a, b: triton_kernels.block_sparse_product(
            "matern32", a, a, b, layout)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    rows = []
    for name, product in products.items():
        best = {"forward": float("inf"), "backward": float("inf")}
        for run in range(4):  # the first warms up
            a, b = z.clone().requires_grad_(), values.clone().requires_grad_()
            _sync(device)
            tic = time.perf_counter()
            out = product(a, b)
            _sync(device)
            middle = time.perf_counter()
            out.backward(torch.ones_like(out))
            _sync(device)
            if run:
                best = {"forward": min(best["forward"], middle - tic),
                        "backward": min(best["backward"], time.perf_counter() - middle)}
        rows += [{"measure": f"block-sparse {part}", "backend": name, "device": card, "n": n,
                  "seconds": t, "entries_per_s": n * n / t} for part, t in best.items()]
    return rows


def _backward_seconds(kernel, x: torch.Tensor, v: torch.Tensor, device: torch.device) -> float:
    """The backward of (K(x, x) V)².sum() for x and V (the symmetric pass), one run."""
    a, b = x.clone().requires_grad_(), v.clone().requires_grad_()
    loss = kernel_matmul(kernel, a, a, b, backend="triton").square().sum()
    _sync(device)
    tic = time.perf_counter()
    loss.backward()
    _sync(device)
    return time.perf_counter() - tic


SWEEP_MODES = (("ieee", "expand"), ("ieee,tf32x3", "expand"), ("tf32x3", "expand"),
               ("ieee,tf32x3", "diff"))
"""Stage 1 of :func:`sweep`: (precisions of the distances and the products, D² formation)."""

SWEEP_SHAPES = ("BM=128,BN=32,W=8", "BM=128,BN=64,W=8", "BM=64,BN=64,W=4", "BM=64,BN=32,W=4",
                "BM=64,BN=64,W=8", "BM=256,BN=32,W=8")
"""Stage 2 of :func:`sweep`: launch shapes, each with 2 and 3 pipeline stages (the ones that
compile for sm_90 without register spills first)."""

BACKWARD_SHAPES = ("BM=64,BN=16,W=4,S=1", "BM=64,BN=32,W=4,S=1", "BM=64,BN=16,W=4,S=2",
                   "BM=64,BN=32,W=4,S=2")
"""Stage 3 of :func:`sweep`: the symmetric backward's launch shapes."""

ERROR_BAR = 1e-5
"""The largest max relative error against float64 a configuration may have to be chosen."""


_SETTINGS = ("GPSCALE_TRITON_TILES", "GPSCALE_TRITON_PRECISION", "GPSCALE_TRITON_DISTANCE",
             "GPSCALE_TRITON_BACKWARD_TILES")


def _configure(tiles: str, precision: str, distance: str, backward: str) -> None:
    import os

    os.environ.update(dict(zip(_SETTINGS, (tiles, precision, distance, backward), strict=True)))


def _measure(kernel, x, v, reference, roofline, device, tiles, precision, distance,
             backward: str | None) -> dict[str, Any]:
    """One configuration's forward (fraction of the roofline, error) and, with ``backward``,
    its symmetric backward; a configuration that fails to compile or launch is a row with a
    note."""
    n = x.shape[0]
    _configure(tiles, precision, distance, backward or BACKWARD_SHAPES[0])
    row = {"tiles": tiles, "precision": precision, "distance": distance, "n": n}
    if backward:
        row["backward_tiles"] = backward
    try:
        with torch.no_grad():
            seconds = _seconds(lambda: kernel_matmul(kernel, x, x, v, backend="triton"), device)
            out = kernel_matmul(kernel, x, x, v, backend="triton")[:CHECK_ROWS]
        row.update(seconds=seconds, fraction_of_roofline=n * n / seconds / roofline,
                   max_rel_error=((out.double() - reference).abs().max()
                                  / reference.abs().max()).item())
        if backward:
            row["backward_s"] = min(_backward_seconds(kernel, x, v, device) for _ in range(3))
            row["backward_ratio"] = row["backward_s"] / seconds
    except Exception as err:  # noqa: BLE001 - a shape that does not compile is a row
        row["note"] = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    if triton_kernels._FAILED:  # the launch failed and the tiles ran: not this shape's figure
        row = {**{k: row[k] for k in ("tiles", "precision", "distance", "n", "backward_tiles")
                  if k in row}, "note": f"launch failed: {triton_kernels._FAILED[0]}"}
        triton_kernels._FAILED.clear()
    log.info("sweep %s", row)
    return row


def _ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows within :data:`ERROR_BAR`, fastest forward first."""
    good = [r for r in rows if r.get("max_rel_error", 1.0) <= ERROR_BAR]
    return sorted(good, key=lambda r: r["seconds"])


def sweep(device: torch.device, n: int = 100_000, *, modes=SWEEP_MODES, shapes=SWEEP_SHAPES,
          backward_shapes=BACKWARD_SHAPES, gemm_size: int = 8192,
          budget_s: float = 150.0) -> list[dict[str, Any]]:
    """Tune the Triton kernels at ``n`` (d = 8, k = 64, Matérn-3/2, float32) in three stages:
    (1) every precision × D² mode of :data:`SWEEP_MODES` at the first shape; (2) the two best
    modes within :data:`ERROR_BAR` at every shape of ``shapes`` × {2, 3} stages; (3) the two
    fastest forwards, each with every backward shape of ``backward_shapes``. The last row,
    ``"chosen": True``, is the fastest forward within the bar with its fastest backward: the
    environment settings to run it with (``scripts/gpu-check.sh tune``). Stage 2 stops adding
    configurations once ``budget_s`` seconds have passed (device time is short)."""
    import os

    saved = {k: os.environ.get(k) for k in _SETTINGS}
    started = time.perf_counter()
    kernel, x, v, reference = _float32_problem(n, device)
    roofline = gemm_tflops(device, gemm_size) * 1e12 / (2 * (NUM_RHS + NUM_DIMS))
    rows: list[dict[str, Any]] = []

    def measure(tiles, precision, distance, backward=None):
        return _measure(kernel, x, v, reference, roofline, device, tiles, precision, distance,
                        backward)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a failed shape is in its row
            rows += [measure(shapes[0] + ",S=3", *mode) for mode in modes]
            for precision, distance in [(r["precision"], r["distance"])
                                        for r in _ranked(rows)[:2]]:
                for tiles in (f"{shape},S={stages}" for shape in shapes for stages in (2, 3)):
                    if time.perf_counter() - started < budget_s and not any(
                            (r["tiles"], r["precision"], r["distance"])
                            == (tiles, precision, distance) for r in rows):
                        rows.append(measure(tiles, precision, distance))
            finalists = [measure(r["tiles"], r["precision"], r["distance"], backward)
                         for r in _ranked(rows)[:2] for backward in backward_shapes]
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})
    rows += finalists
    forward = _ranked(rows)
    timed = [r for r in finalists if "backward_s" in r and forward
             and (r["tiles"], r["precision"], r["distance"])
             == (forward[0]["tiles"], forward[0]["precision"], forward[0]["distance"])]
    if forward:
        best = {**forward[0], **(min(timed, key=lambda r: r["backward_s"]) if timed else {})}
        best["seconds"] = forward[0]["seconds"]
        best["fraction_of_roofline"] = forward[0]["fraction_of_roofline"]
        rows.append({**best, "chosen": True, "env": (
            f"GPSCALE_TRITON_TILES={best['tiles']} GPSCALE_TRITON_PRECISION="
            f"{best['precision']} GPSCALE_TRITON_DISTANCE={best['distance']}"
            f" GPSCALE_TRITON_BACKWARD_TILES={best.get('backward_tiles', backward_shapes[0])}")})
    return rows
