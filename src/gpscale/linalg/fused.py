r"""Fused products with stationary kernel profiles: distance → profile → product, tile by tile.

For scaled inputs ``z1`` (B, n1, d), ``z2`` (B, n2, d) and right-hand sides ``V`` (B, n2, k) this
computes :math:`\Phi V` with :math:`\Phi_{ij} = \varphi(D^2_{ij})`,
:math:`D^2_{ij} = \lVert z_{1i} - z_{2j}\rVert^2 = \lVert z_{1i}\rVert^2 + \lVert z_{2j}\rVert^2
- 2 z_{1i}^\top z_{2j}` (clamped to [0, ``FAR_SQDIST``], where every profile is 0), without
forming :math:`\Phi`.

| profile  | :math:`\varphi(D^2)`, :math:`r = a\sqrt{D^2}` | :math:`\varphi'(D^2)`             |
|----------|-----------------------------------------------|-----------------------------------|
| rbf      | :math:`e^{-D^2/2}`                            | :math:`-\varphi/2`                |
| matern12 | :math:`e^{-r}`, a = 1                         | :math:`-e^{-r}/(2r)` (0 at r = 0) |
| matern32 | :math:`(1 + r)e^{-r}`, a = √3                 | :math:`-\tfrac32 e^{-r}`          |
| matern52 | :math:`(1 + r + r^2/3)e^{-r}`, a = √5         | :math:`-\tfrac56 (1 + r)e^{-r}`   |

The Matérn-½ profile is not differentiable at coincident points; its gradient there is taken as 0,
like ``torch.cdist``'s.

Backward, with :math:`G = \bar{Y} V^\top` and :math:`H = G \odot \varphi'(D^2)` (per tile):
:math:`\bar V = \Phi^\top \bar Y`, :math:`\bar z_1 = 2(\operatorname{diag}(H 1) z_1 - H z_2)`,
:math:`\bar z_2 = 2(\operatorname{diag}(H^\top 1) z_2 - H^\top z_1)`.

The inner products and the products with ``V`` are batched GEMMs (``bmm``/``baddbmm``); the
elementwise part (norms → clamp → sqrt → exp → polynomial, and ``H`` with its row and column sums)
is one function per profile, compiled with ``torch.compile(dynamic=True)`` when ``compiled=True``
so that ragged chunks do not trigger recompilation. A tile holds ``rows × cols`` entries with
``cols = tile_entries // (B · rows)`` (cache-sized on the CPU, far larger on a GPU), never more
than a ``rows × n2`` block.
Cost: :math:`2 n_1 n_2 (k + d)` flops forward plus O(n1 n2) elementwise; twice that backward.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from gpscale.linalg import compile_ahead
from gpscale.linalg.chunked import ChunkRule
from gpscale.linalg.reach import FAR_SQDIST

__all__ = ["DEFAULT_ROWS", "DISTANCE_TOLERANCE", "EXACT_DIFF_DIMS", "PROFILES", "TILE_ENTRIES",
           "TILE_ENTRIES_GPU", "compiled_profile", "default_rows", "exact_dims", "exact_last",
           "gpu_tile_entries", "inner_products", "span_rows", "sq_norms", "stationary_rule",
           "tile_entries", "wait_for_compilation", "COMPILE_IN_BACKGROUND"]

TILE_ENTRIES = 2**20
"""Kernel entries per tile (4 MiB in float32), sized for the caches; tuned on a 2-core EPYC."""

TILE_ENTRIES_GPU = 2**26
"""Kernel entries per tile on a GPU (256 MiB in float32). Every tile costs a few kernel launches
and a Python step whatever its size, so cache-sized tiles leave a GPU waiting on the host, and
a tile this large spreads that cost over enough work to keep it busy. Capped by
:func:`tile_entries` at a sixteenth of the device's free memory."""

DEFAULT_ROWS = 2048
"""Default rows of ``x1`` per chunk for the fused paths on the CPU (a tile never exceeds
:func:`tile_entries`); on a GPU :func:`default_rows` takes larger chunks."""


def tile_entries(like: Tensor) -> int:
    """Kernel entries per tile for tensors like ``like``: :data:`TILE_ENTRIES` on the CPU,
    :data:`TILE_ENTRIES_GPU` on a GPU, at most 1/16 of its free memory (a tile has a few
    temporaries of its size)."""
    if like.device.type != "cuda":
        return TILE_ENTRIES
    free, _ = torch.cuda.mem_get_info(like.device)
    return gpu_tile_entries(free, like.element_size())


def gpu_tile_entries(free_bytes: int, element_size: int) -> int:
    """:data:`TILE_ENTRIES_GPU` entries, at most ``free_bytes / 16`` bytes of them, and at least
    :data:`TILE_ENTRIES`."""
    return max(TILE_ENTRIES, min(TILE_ENTRIES_GPU, free_bytes // (16 * element_size)))


def span_rows(like: Tensor) -> int:
    """Rows per span of the square block-sparse tiles: ``√tile_entries(like)``."""
    return math.isqrt(tile_entries(like))


def default_rows(like: Tensor) -> int:
    """Rows of ``x1`` per chunk of the fused products: :data:`DEFAULT_ROWS` on the CPU, a span's
    rows on a GPU."""
    return DEFAULT_ROWS if like.device.type != "cuda" else span_rows(like)

DISTANCE_TOLERANCE = 1e-3
"""Largest acceptable rounding error of D² from the norm expansion (see :func:`exact_dims`)."""

EXACT_DIFF_DIMS = 4
"""Up to this many exact dimensions are summed as squared differences; more go through float64."""

_SQRT3, _SQRT5 = math.sqrt(3.0), math.sqrt(5.0)


def exact_dims(z1: Tensor, z2: Tensor) -> tuple[Tensor, int]:
    """The dimensions whose squared distances must not come from the norm expansion.

    ``‖z₁‖² + ‖z₂‖² − 2z₁ᵀz₂`` loses about ``2ε Σ_d max|z_d|²`` of absolute accuracy (ε the
    dtype's machine epsilon): harmless for scaled inputs of order 1, but a lengthscale of 10⁻³
    on a standardised feature gives |z| ~ 10³ and, in float32, errors of 0.1 in D², enough to make
    a kernel matrix indefinite. Dimensions are taken out largest first until the rest keeps the
    error below :data:`DISTANCE_TOLERANCE`; :func:`inner_products` computes their part exactly.

    Args:
        z1, z2: (..., n, d) centred, scaled inputs.

    Returns:
        ``(order, k)``: a permutation of the d dimensions that puts the k exact ones last.
    """
    with torch.no_grad():
        reach = torch.maximum(z1.detach().abs().flatten(0, -2).amax(0),
                              z2.detach().abs().flatten(0, -2).amax(0)).double().square()
        order = torch.argsort(reach)  # ascending: the exact (largest) dimensions end up last
        budget = DISTANCE_TOLERANCE / (2.0 * torch.finfo(z1.dtype).eps)
        kept = int((reach[order].cumsum(0) <= budget).sum())
    return order, z1.shape[-1] - kept


def exact_last(z1: Tensor, z2: Tensor) -> tuple[Tensor, Tensor, int]:
    """z1, z2 with the dimensions :func:`exact_dims` picks moved last, and their count."""
    order, exact = exact_dims(z1, z2)
    if exact == 0:
        return z1, z2, 0
    return z1[..., order], z2[..., order], exact


def sq_norms(z: Tensor, exact: int = 0) -> Tensor:
    """Squared norms over the first ``d − exact`` dimensions, shape (..., n)."""
    head = z[..., : z.shape[-1] - exact]
    return (head * head).sum(-1)


def inner_products(z1: Tensor, z2: Tensor, out: Tensor, exact: int = 0) -> Tensor:
    """``out`` ← P (B, c, w) with ``sq1 + sq2 − 2P`` = D² for norms from :func:`sq_norms`.

    The first ``d − exact`` dimensions give plain inner products (one GEMM); the last ``exact``
    contribute −½ (z₁ − z₂)² each, from differences (or, beyond :data:`EXACT_DIFF_DIMS`, from
    the norm expansion in float64), so that their large coordinates never cancel in low
    precision. With ``exact = 0`` this is ``torch.bmm(z1, z2ᵀ)``.
    """
    d = z1.shape[-1] - exact
    torch.bmm(z1[..., :d], z2[..., :d].mT, out=out)
    if exact == 0:
        return out
    e1, e2 = z1[..., d:], z2[..., d:]
    if exact <= EXACT_DIFF_DIMS:
        for j in range(exact):
            out.sub_(0.5 * (e1[..., :, j, None] - e2[..., None, :, j]).square())
    else:
        e1, e2 = e1.double(), e2.double()
        cross = torch.bmm(e1, e2.mT)
        half = 0.5 * ((e1 * e1).sum(-1)[..., :, None] + (e2 * e2).sum(-1)[..., None, :])
        out.sub_((half - cross).clamp_min(0.0).to(out.dtype))
    return out


def _sqdist(P: Tensor, sq1: Tensor, sq2: Tensor) -> Tensor:
    # Clamped above at FAR_SQDIST, where every profile is already exactly 0: an overflowed D² = ∞
    # then gives φ = 0 (its limit) instead of Matérn's ∞ · 0 = NaN; same cost.
    return (sq1 + sq2 - 2.0 * P).clamp(0.0, FAR_SQDIST)  # (B, c, w)


def _store(P: Tensor, G: Tensor, K: Tensor, H: Tensor) -> tuple[Tensor, Tensor]:
    P.copy_(K)
    G.copy_(H)
    return H.sum(-1), H.sum(-2)  # (B, c), (B, w)


# Each profile has two functions, both in place to reuse the tile buffers (fresh multi-MB
# tensors cost page faults): ``value(P, sq1, sq2)`` overwrites the inner products P with
# φ(D²); ``vjp(P, sq1, sq2, G)`` overwrites P with φ(D²) and G with H = G ⊙ φ'(D²) and returns
# H's row and column sums. Each is its own code object, so torch.compile keeps separate caches
# (no recompilation limit shared between profiles).
def _rbf_value(P: Tensor, sq1: Tensor, sq2: Tensor) -> None:
    P.copy_(torch.exp(-0.5 * _sqdist(P, sq1, sq2)))


def _rbf_vjp(P: Tensor, sq1: Tensor, sq2: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    K = torch.exp(-0.5 * _sqdist(P, sq1, sq2))
    return _store(P, G, K, -0.5 * K * G)


def _matern12_value(P: Tensor, sq1: Tensor, sq2: Tensor) -> None:
    P.copy_(torch.exp(-_sqdist(P, sq1, sq2).sqrt()))


def _matern12_vjp(P: Tensor, sq1: Tensor, sq2: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    r = _sqdist(P, sq1, sq2).sqrt()
    K = torch.exp(-r)
    return _store(P, G, K, torch.where(r > 0, -0.5 * K / r, 0.0) * G)


def _matern32_value(P: Tensor, sq1: Tensor, sq2: Tensor) -> None:
    r = _SQRT3 * _sqdist(P, sq1, sq2).sqrt()
    P.copy_((1.0 + r) * torch.exp(-r))


def _matern32_vjp(P: Tensor, sq1: Tensor, sq2: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    r = _SQRT3 * _sqdist(P, sq1, sq2).sqrt()
    e = torch.exp(-r)
    return _store(P, G, (1.0 + r) * e, -1.5 * e * G)


def _matern52_value(P: Tensor, sq1: Tensor, sq2: Tensor) -> None:
    r = _SQRT5 * _sqdist(P, sq1, sq2).sqrt()
    P.copy_((1.0 + r + r * r / 3.0) * torch.exp(-r))


def _matern52_vjp(P: Tensor, sq1: Tensor, sq2: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    r = _SQRT5 * _sqdist(P, sq1, sq2).sqrt()
    e = torch.exp(-r)
    return _store(P, G, (1.0 + r + r * r / 3.0) * e, (-5.0 / 6.0) * (1.0 + r) * e * G)


PROFILES: dict[str, tuple[Callable, Callable]] = {
    "rbf": (_rbf_value, _rbf_vjp),
    "matern12": (_matern12_value, _matern12_vjp),
    "matern32": (_matern32_value, _matern32_vjp),
    "matern52": (_matern52_value, _matern52_vjp),
}
"""Profile name → (value function, value-and-vjp function) on tiles of inner products."""


def _compile_errors() -> tuple[type[BaseException], ...]:
    """The failures torch.compile reports when it cannot build a kernel (no C++ compiler, an
    unsupported platform, a backend bug); anything else is a genuine error and propagates."""
    # imported on first use: torch._dynamo takes seconds to import
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError, OSError)


COMPILE_IN_BACKGROUND = True
"""Compile ahead in a child process while the calls run uncompiled (see
:class:`_CompiledFunction`); ``False`` compiles on the first call, blocking it (tests of the
compiled code, benchmarks)."""


class _CompiledFunction:
    """``fn`` compiled with ``torch.compile(dynamic=True)``, falling back to ``fn`` on failure.

    With :data:`COMPILE_IN_BACKGROUND` the first call submits ``fn`` to
    :mod:`gpscale.linalg.compile_ahead` (a child process fills the on-disk compile caches for
    arguments like the call's) and runs ``fn`` itself; so do later calls until the child is
    done, when a call compiles ``fn`` in this process from the warm cache (1–2 s per
    function instead of 5–20 s cold) and uses it from then on. A training run's first epochs do not
    wait for the compiler, and nothing here runs while torch's process-wide "compiling" flag is
    set (see the module :mod:`~gpscale.linalg.compile_ahead` for why a thread is not safe). Shapes
    the compiled code does not cover afterwards run uncompiled rather than recompiling. A
    compilation failure is reported once with a warning; later calls run ``fn``.
    """

    def __init__(self, fn: Callable, compiler: Callable = torch.compile,
                 ahead: Callable = compile_ahead.submit):
        self.fn = fn
        self.compiler = compiler
        self.compiled: Callable | None = None  # wrapped on the first compiled call
        self.ahead = ahead
        self.failed = False
        self.ready = False
        self.job: compile_ahead.Job | None = None

    def __call__(self, *args: Tensor):
        if self.failed:
            return self.fn(*args)
        if self.ready and COMPILE_IN_BACKGROUND:  # covered shapes only: no recompilation here
            with torch.compiler.set_stance("eager_on_recompile"):
                return self._try_compiled(args)
        if self.ready or not COMPILE_IN_BACKGROUND or self._ahead_done(args):
            return self._try_compiled(args)
        return self.fn(*args)

    def _ahead_done(self, args: tuple) -> bool:
        if self.job is None:
            self.job = self.ahead(self.fn, args, torch.is_grad_enabled())
        else:
            compile_ahead.poll()
        return self.job.done

    def _try_compiled(self, args: tuple):
        if self.compiled is None:  # torch.compile imports torch._dynamo (seconds)
            self.compiled = self.compiler(self.fn, dynamic=True)
        try:
            out = self.compiled(*args)
        except _compile_errors() as exc:
            self._report(exc)
            return self.fn(*args)
        self.ready = True
        return out

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compile-ahead job has finished; whether it succeeded."""
        return self.job is not None and compile_ahead.wait(self.job, timeout)

    def _report(self, exc: BaseException) -> None:
        self.failed = True
        warnings.warn(f"torch.compile failed for the fused kernel product "
                      f"({self.fn.__name__}): {type(exc).__name__}: {exc}; falling back "
                      "to the uncompiled fused path (pass backend='eager' or 'fused' to "
                      "skip compilation)", RuntimeWarning, stacklevel=4)


_COMPILED: dict[Callable, _CompiledFunction] = {}


def _compiled(fn: Callable) -> _CompiledFunction:
    # Process-wide cache of compiled profile functions (torch.compile's own caches are global too).
    if fn not in _COMPILED:
        _COMPILED[fn] = _CompiledFunction(fn)
    return _COMPILED[fn]


def compiled_profile(fn: Callable) -> Callable:
    """The process-wide compiled form of a :data:`PROFILES` function (compiled ahead, see
    :class:`_CompiledFunction`; uncompiled until then)."""
    return _compiled(fn)


def wait_for_compilation(timeout: float | None = None) -> None:
    """Block until every compile-ahead job started so far has finished."""
    for compiled in _COMPILED.values():
        compiled.wait(timeout)


def _tiles(num_cols: int, rows: int, entries: int) -> list[slice]:
    """Column slices so that ``rows × width ≤ entries`` (width ≥ 1)."""
    cols = max(1, entries // max(1, rows))
    return [slice(j, min(j + cols, num_cols)) for j in range(0, num_cols, cols)]


def _tile_buffer(like: Tensor, B: int, c: int, tiles: list[slice]) -> Callable[[slice], Tensor]:
    """A (B, c, width) view of one flat buffer per tile width (reused across tiles)."""
    flat = like.new_empty(B * c * (tiles[0].stop - tiles[0].start))
    return lambda cols: flat[: B * c * (cols.stop - cols.start)].view(B, c, -1)


def _kernel_tiles(value: Callable, z1: Tensor, z2: Tensor,
                  exact: int) -> Iterator[tuple[slice, Tensor]]:
    """Yield ``(cols, Φ[:, :, cols])`` tile by tile, each written into the same buffer."""
    B, c, _ = z1.shape
    sq1 = sq_norms(z1, exact).unsqueeze(-1)  # (B, c, 1)
    tiles = _tiles(z2.shape[1], B * c, tile_entries(z1))
    tile = _tile_buffer(z1, B, c, tiles)
    for cols in tiles:
        z2t, K = z2[:, cols], tile(cols)  # (B, w, d), (B, c, w)
        inner_products(z1, z2t, K, exact)
        value(K, sq1, sq_norms(z2t, exact).unsqueeze(-2))  # K ← φ(D²)
        yield cols, K


def stationary_rule(profile: str, *, compiled: bool, exact: int = 0) -> ChunkRule:
    """A :class:`ChunkRule` for :math:`\\Phi V` with the named profile on 3-D inputs.

    Args:
        profile: a key of :data:`PROFILES`.
        compiled: compile the elementwise functions with ``torch.compile``.
        exact: the last ``exact`` dimensions of the inputs enter D² exactly (see
            :func:`exact_dims` and :func:`inner_products`).

    Returns:
        A rule for :func:`gpscale.linalg.chunked.chunked_product` with inputs ``z1`` (B, n1, d),
        ``z2`` (B, n2, d), ``rhs`` (B, n2, k) and output (B, n1, k).
    """
    value, value_vjp = PROFILES[profile]
    if compiled:
        value, value_vjp = _compiled(value), _compiled(value_vjp)

    def forward(z1: Tensor, z2: Tensor, rhs: Tensor) -> Tensor:
        out = z1.new_zeros(*z1.shape[:2], rhs.shape[-1])  # (B, c, k)
        for cols, K in _kernel_tiles(value, z1, z2, exact):
            out.baddbmm_(K, rhs[:, cols])
        return out

    def transpose_product(z1: Tensor, z2: Tensor, grad_out: Tensor) -> Tensor:
        grad_rhs = z2.new_empty(*z2.shape[:2], grad_out.shape[-1])  # (B, n2, k)
        for cols, K in _kernel_tiles(value, z1, z2, exact):
            torch.bmm(K.mT, grad_out, out=grad_rhs[:, cols])
        return grad_rhs

    def vjp(z1: Tensor, z2: Tensor, rhs: Tensor, grad_out: Tensor, needs: tuple[bool, ...]):
        B, c, _ = z1.shape
        if not (needs[0] or needs[1]):  # only V̄ = Φᵀ Ȳ: no profile derivative needed
            return None, None, transpose_product(z1, z2, grad_out)
        # The thin products (d columns) are formed transposed, d rows by c or w columns, as
        # the composed kernels' backward forms them; H's row sums gather across the tiles and
        # z₁'s term is formed once at the end, not once per tile.
        grad_z1t = z1.new_zeros(B, z1.shape[-1], c)  # (H Z₂)ᵀ, (B, d, c)
        row_sums = z1.new_zeros(B, c)
        grad_z2 = torch.empty_like(z2)
        grad_rhs = torch.empty_like(rhs) if needs[2] else None
        sq1 = sq_norms(z1, exact).unsqueeze(-1)  # (B, c, 1)
        tiles = _tiles(z2.shape[1], B * c, tile_entries(z1))
        tile_K, tile_H = _tile_buffer(z1, B, c, tiles), _tile_buffer(z1, B, c, tiles)
        for cols in tiles:
            z2t, rhs_t = z2[:, cols], rhs[:, cols]  # (B, w, d), (B, w, k)
            K, H = tile_K(cols), tile_H(cols)  # (B, c, w) each
            inner_products(z1, z2t, K, exact)
            torch.bmm(grad_out, rhs_t.mT, out=H)  # G = Ȳ Vᵀ
            H_rows, H_cols = value_vjp(K, sq1, sq_norms(z2t, exact).unsqueeze(-2), H)
            if grad_rhs is not None:
                torch.bmm(K.mT, grad_out, out=grad_rhs[:, cols])
            row_sums += H_rows
            grad_z1t.baddbmm_(z2t.mT, H.mT)
            grad_z2[:, cols] = 2.0 * (H_cols.unsqueeze(-1) * z2t - torch.bmm(z1.mT, H).mT)
        return 2.0 * (row_sums.unsqueeze(-1) * z1 - grad_z1t.mT), grad_z2, grad_rhs

    return ChunkRule(forward=forward, vjp=vjp)
