"""Standardisation of inputs and targets with training statistics only.

The statistics are computed on the training rows and then applied, unchanged, to any other rows
(test points, new inputs at predict time), so nothing about the test set leaks into the model.

Notation: inputs ``x`` (n, d), targets ``y`` (n,). A column is *constant* when all its training
values are equal (in float64), or spread by less than the smallest normal float64 (2.2e-308, by
which any other value would standardise to infinity); such a column carries no information for a
stationary kernel and
would give a zero standard deviation, so it is dropped and ``kept_columns`` records which columns
remain. Any other column is kept, at any scale: the statistics are computed on the column's
differences from its first value, divided by the largest of them (:func:`_column_stats`), so
that neither a spread of 1e-300 (whose square underflows) nor values near 2**64 (whose sum
loses the spread) is mistaken for a constant. The input means are kept as two floats, the mean
rounded to float64 and what that rounding left out (``x_mean_low``), so that values near 2**64
a few units of the last place apart are still standardised to mean 0 and standard deviation 1.

Standard deviations use the population formula (``correction=0``), so the standardised training
columns have mean 0 and standard deviation exactly 1 under that same definition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpscale.typing import Float, Tensor

__all__ = ["Standardizer"]


@dataclass(frozen=True)
class Standardizer:
    r"""Affine maps :math:`\tilde x = (x_{:,K} - \mu_x)/s_x` and :math:`\tilde y = (y - \mu_y)/s_y`.

    The statistics are stored as tuples of Python floats, so the object is hashable, comparable
    and JSON-able; every method builds tensors with the dtype and device of its argument.

    Attributes:
        x_mean: training means of the kept columns, length d_kept.
        x_std: training standard deviations of the kept columns, length d_kept.
        kept_columns: indices (into the original d columns) of the non-constant columns.
        num_input_dims: d, the number of columns before dropping.
        y_mean: training mean of y (0.0 when y is not standardised).
        y_std: training standard deviation of y (1.0 when y is not standardised).
        x_mean_low: the training means minus ``x_mean`` (the part float64 rounding dropped),
            subtracted after ``x_mean``; empty means zeros (files written before it existed).

    Example:
        >>> x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
        >>> t = Standardizer.fit(x, torch.tensor([0.0, 2.0]))
        >>> t.kept_columns, t.transform_x(x).flatten().tolist()
        ((0,), [-1.0, 1.0])
    """

    x_mean: tuple[float, ...]
    x_std: tuple[float, ...]
    kept_columns: tuple[int, ...]
    num_input_dims: int
    y_mean: float = 0.0
    y_std: float = 1.0
    x_mean_low: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.x_mean) == len(self.x_std) == len(self.kept_columns)):
            raise ValueError("x_mean, x_std and kept_columns must have the same length; got "
                             f"{len(self.x_mean)}, {len(self.x_std)}, {len(self.kept_columns)}")
        if self.x_mean_low and len(self.x_mean_low) != len(self.x_mean):
            raise ValueError(f"x_mean_low must be empty or of length {len(self.x_mean)}; got "
                             f"{len(self.x_mean_low)}")
        if any(s <= 0 for s in self.x_std) or self.y_std <= 0:
            raise ValueError("standard deviations must be positive")
        if any(not 0 <= j < self.num_input_dims for j in self.kept_columns):
            raise ValueError(f"kept_columns must lie in 0..{self.num_input_dims - 1}")

    @classmethod
    def fit(cls, x: Float[Tensor, "n d"], y: Float[Tensor, " n"] | None = None, *,
            standardize_y: bool = True, standardize_x: bool = True) -> Standardizer:
        """Compute the statistics from training data.

        Args:
            x: training inputs, shape (n, d).
            y: training targets, shape (n,), or ``None``.
            standardize_y: when ``False`` (or ``y`` is ``None``) the target map is the identity,
                as for class labels and counts.
            standardize_x: when ``False`` the input map is the identity and every column is
                kept, as for the pixels of images (a patch needs every pixel on one scale).

        Returns:
            The fitted standardiser.

        Raises:
            ValueError: when x is not 2-D, has fewer than 2 rows or non-finite values, when y
                has the wrong shape or non-finite values, when every column is constant, or
                when y is standardised but constant.
        """
        if x.dim() != 2 or x.shape[0] < 2:
            raise ValueError(f"x must have shape (n, d) with n >= 2; got {tuple(x.shape)}")
        _check_finite(x, "x")
        if y is not None:
            if y.shape != (x.shape[0],):
                raise ValueError(f"y must have shape ({x.shape[0]},); got {tuple(y.shape)}")
            _check_finite(y, "y")
        xd = x.detach().to(torch.float64)
        mean_all, low_all, std_all = _column_stats(xd)  # (d,) each; std 0 where constant
        if not bool(torch.isfinite(std_all).all()):
            cols = torch.nonzero(~torch.isfinite(std_all)).flatten().tolist()
            raise ValueError(f"x columns {cols} are too large to standardise in float64 "
                             f"(largest |value| {float(xd.abs().max()):g}); rescale them")
        if not standardize_x:  # the identity on every column
            mean_all, low_all = torch.zeros_like(mean_all), torch.zeros_like(low_all)
            std_all = torch.ones_like(std_all)
        # a spread below the smallest normal float64 is no scale to standardise by: any other
        # value divided by it overflows, so such a column counts as constant
        keep = (std_all > torch.finfo(torch.float64).tiny).nonzero().flatten()  # (d_kept,)
        if keep.numel() == 0:
            raise ValueError(f"all {x.shape[1]} input columns are constant on the training set")
        mean, low, std = mean_all[keep], low_all[keep], std_all[keep]
        y_mean, y_std = 0.0, 1.0
        if y is not None and standardize_y:
            yd = y.detach().to(torch.float64)
            high, low_y, std_y = _column_stats(yd[:, None])
            y_mean, y_std = float(high[0] + low_y[0]), float(std_y[0])
            if not y_std < float("inf"):
                raise ValueError(f"y is too large to standardise in float64 (largest |value| "
                                 f"{float(yd.abs().max()):g}); rescale it")
            if not y_std > 0:
                raise ValueError(f"y is constant on the training rows (every value is "
                                 f"{float(yd[0]):g}); regression needs targets that vary")
        return cls(x_mean=tuple(mean.tolist()), x_std=tuple(std.tolist()),
                   kept_columns=tuple(keep.tolist()), num_input_dims=x.shape[1],
                   y_mean=y_mean, y_std=y_std,
                   x_mean_low=tuple(low.tolist()) if bool((low != 0).any()) else ())

    @property
    def num_dims(self) -> int:
        """Number of columns after dropping the constant ones."""
        return len(self.kept_columns)

    @property
    def dropped_columns(self) -> tuple[int, ...]:
        """Indices of the columns that were constant on the training set."""
        kept = set(self.kept_columns)
        return tuple(j for j in range(self.num_input_dims) if j not in kept)

    def transform_x(self, x: Float[Tensor, "n d"], *,
                    inplace: bool = False) -> Float[Tensor, "n k"]:
        """Drop the constant columns and standardise: (n, d) -> (n, d_kept).

        One new array of the result's size (none with ``inplace=True`` when no column is
        dropped: ``x`` itself is overwritten and returned), so that millions of rows are
        standardised without temporaries.
        """
        if x.dim() != 2 or x.shape[1] != self.num_input_dims:
            raise ValueError(f"x must have shape (n, {self.num_input_dims}); "
                             f"got {tuple(x.shape)}")
        ftype = x.dtype if x.is_floating_point() else torch.float64
        mean = torch.tensor(self.x_mean, dtype=ftype, device=x.device)
        std = torch.tensor(self.x_std, dtype=ftype, device=x.device)
        if inplace and len(self.kept_columns) == x.shape[1] and x.is_floating_point():
            out = x.sub_(mean)
        else:
            kept = torch.tensor(self.kept_columns, dtype=torch.long, device=x.device)
            out = x.index_select(1, kept)
            if not out.is_floating_point():
                out = out.to(ftype)
            out.sub_(mean)
        if self.x_mean_low:  # x - mean is exact near the mean; then the rounded-off part
            out.sub_(torch.tensor(self.x_mean_low, dtype=ftype, device=x.device))
        return out.div_(std)

    def transform_y(self, y: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """Standardise targets: (y - y_mean) / y_std, any shape."""
        return (y - self.y_mean) / self.y_std

    def inverse_mean(self, mu: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """Map a predictive mean back to the original target scale: mu * y_std + y_mean."""
        return mu * self.y_std + self.y_mean

    def inverse_variance(self, var: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """Map a predictive variance back to the original target scale: var * y_std²."""
        return var * self.y_std**2

    def inverse_std(self, var: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """The standard deviation on the original target scale of a standardised predictive
        variance: sqrt(var) * y_std (no square of y_std, which underflows for y_std < 1e-154)."""
        return var.sqrt() * self.y_std

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (lists and floats) that :meth:`from_dict` turns back into ``self``."""
        out = asdict(self)
        for key in ("x_mean", "x_std", "kept_columns", "x_mean_low"):
            out[key] = list(out[key])
        if not out["x_mean_low"]:
            del out["x_mean_low"]  # the dict of an ordinary fit is as before
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Standardizer:
        """Inverse of :meth:`to_dict`."""
        return cls(x_mean=tuple(float(v) for v in data["x_mean"]),
                   x_std=tuple(float(v) for v in data["x_std"]),
                   kept_columns=tuple(int(v) for v in data["kept_columns"]),
                   num_input_dims=int(data["num_input_dims"]),
                   y_mean=float(data["y_mean"]), y_std=float(data["y_std"]),
                   x_mean_low=tuple(float(v) for v in data.get("x_mean_low", ())))


def _column_stats(x: Float[Tensor, "n d"]
                  ) -> tuple[Float[Tensor, " d"], Float[Tensor, " d"], Float[Tensor, " d"]]:
    r"""Mean (as high and low float64 parts) and population standard deviation of each column
    of float64 ``x``, exact to rounding at any scale; the deviation is exactly 0 only for a
    constant column.

    With :math:`r = x_{0,:}` and :math:`s = \max_i |x_{i,:} - r|`, :math:`u = (x - r)/s \in
    [-1, 1]` has a spread of order 1, so neither its square underflows (a column of spread
    1e-300) nor its sum swamps it (values near 2**64 that differ by a few units of their last
    place: the differences from :math:`r` are exact); then mean = r + s·mean(u), std =
    s·std(u). The sum r + s·mean(u) is split into its float64 value and the rounding error
    (Knuth's TwoSum). One (n, d) temporary. A spread beyond float64 gives an inf deviation.
    """
    ref = x[0]  # (d,)
    dev = x - ref  # (n, d), exact for nearby values (Sterbenz)
    low, high = torch.aminmax(dev, dim=0)  # (d,)
    scale = torch.maximum(-low, high)  # (d,); 0 exactly for a constant column
    if not bool(torch.isfinite(scale).all()):
        return ref, torch.zeros_like(ref), torch.where(torch.isfinite(scale), 0.0,
                                                       float("inf")).to(x.dtype)
    dev.div_(torch.where(scale > 0, scale, 1.0))
    std_u, mean_u = torch.std_mean(dev, dim=0, correction=0)  # (d,), (d,)
    shift = scale * mean_u  # (d,)
    high = ref + shift
    back = high - ref  # TwoSum: the rounding error of ref + shift
    low = (ref - (high - back)) + (shift - back)
    return high, low, scale * std_u


def _check_finite(t: Tensor, name: str) -> None:
    """ValueError naming the first rows (0-based) of ``t`` that hold NaN or inf."""
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        rows = torch.nonzero(bad if t.dim() == 1 else bad.any(1)).flatten()
        shown = ", ".join(str(int(i)) for i in rows[:5])
        more = f" and {rows.numel() - 5} more" if rows.numel() > 5 else ""
        raise ValueError(f"{name} contains NaN or inf values (rows {shown}{more}); remove or "
                         "impute them first")
