"""Standardizer: training statistics only, constant columns dropped, exact inverses."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpscale.data.csv import load_csv
from gpscale.data.datasets import standardized_dataset
from gpscale.data.transforms import Standardizer


def test_hand_computed_case():
    """x = [[1, 5], [3, 5]], y = [0, 2]: column 1 is constant, both maps give [-1, 1]."""
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    t = Standardizer.fit(x, torch.tensor([0.0, 2.0]))
    assert t.kept_columns == (0,)
    assert t.dropped_columns == (1,)
    assert (t.x_mean, t.x_std, t.y_mean, t.y_std) == ((2.0,), (1.0,), 1.0, 1.0)
    torch.testing.assert_close(t.transform_x(x), torch.tensor([[-1.0], [1.0]]))
    torch.testing.assert_close(t.transform_y(torch.tensor([0.0, 2.0])), torch.tensor([-1.0, 1.0]))


def test_inverse_maps_hand_computed():
    """y = [-1, 3]: mean 1, std 2, so mu = 0.5 -> 2 and var = 0.25 -> 1."""
    t = Standardizer.fit(torch.tensor([[0.0], [1.0]]), torch.tensor([-1.0, 3.0]))
    assert (t.y_mean, t.y_std) == (1.0, 2.0)
    torch.testing.assert_close(t.inverse_mean(torch.tensor([0.5])), torch.tensor([2.0]))
    torch.testing.assert_close(t.inverse_variance(torch.tensor([0.25])), torch.tensor([1.0]))


def test_inverse_mean_undoes_transform_y(generator):
    y = 3 + 2 * torch.randn(50, generator=generator)
    t = Standardizer.fit(torch.randn(50, 2, generator=generator), y)
    torch.testing.assert_close(t.inverse_mean(t.transform_y(y)), y, rtol=0, atol=1e-12)


def test_train_statistics_are_zero_mean_unit_std(generator):
    x = 10 + 3 * torch.randn(200, 4, generator=generator)
    y = -5 + 7 * torch.randn(200, generator=generator)
    t = Standardizer.fit(x, y)
    xs, ys = t.transform_x(x), t.transform_y(y)
    torch.testing.assert_close(xs.mean(0), torch.zeros(4), rtol=0, atol=1e-12)
    torch.testing.assert_close(xs.std(0, correction=0), torch.ones(4), rtol=0, atol=1e-12)
    torch.testing.assert_close(ys.mean(), torch.tensor(0.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(ys.std(correction=0), torch.tensor(1.0), rtol=0, atol=1e-12)


def test_test_rows_do_not_change_the_transform(generator):
    """Changing only test rows leaves the fitted statistics and the training data unchanged."""
    x = torch.randn(60, 3, generator=generator)
    y = torch.randn(60, generator=generator)
    train, test = torch.arange(50), torch.arange(50, 60)
    x2, y2 = x.clone(), y.clone()
    x2[test] = 1000 * torch.randn(10, 3, generator=generator)
    y2[test] = -1000.0
    a = standardized_dataset("a", x, y, train, test)
    b = standardized_dataset("b", x2, y2, train, test)
    assert a.transform == b.transform
    torch.testing.assert_close(a.x_train, b.x_train, rtol=0, atol=0)
    torch.testing.assert_close(a.y_train, b.y_train, rtol=0, atol=0)
    expected = (x2[test] - x[train].mean(0)) / x[train].std(0, correction=0)
    torch.testing.assert_close(b.x_test, expected)


def test_column_constant_on_train_only_is_dropped():
    """Column 1 varies only in the test rows; it is dropped because training rows decide."""
    x = torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0], [3.0, 9.0]])
    data = standardized_dataset("c", x, torch.arange(4.0), torch.arange(3), torch.tensor([3]))
    assert data.num_dims == 1
    assert data.info["dropped_columns"] == [1]
    torch.testing.assert_close(data.x_test, torch.tensor([[(3.0 - 1.0) / (2 / 3) ** 0.5]]))


def test_standardize_y_false_is_identity(generator):
    y = torch.tensor([0.0, 1.0, 1.0, 2.0])
    t = Standardizer.fit(torch.randn(4, 2, generator=generator), y, standardize_y=False)
    assert (t.y_mean, t.y_std) == (0.0, 1.0)
    torch.testing.assert_close(t.transform_y(y), y, rtol=0, atol=0)


def test_dict_round_trip_is_json_able(generator):
    x = torch.randn(20, 3, generator=generator)
    x[:, 1] = 4.0
    t = Standardizer.fit(x, torch.randn(20, generator=generator))
    restored = Standardizer.from_dict(json.loads(json.dumps(t.to_dict())))
    assert restored == t
    torch.testing.assert_close(restored.transform_x(x), t.transform_x(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (torch.ones(5, 2), None, "all 2 input columns are constant"),
        (torch.arange(10.0).reshape(5, 2), torch.ones(5), "y is constant"),
        (torch.tensor([[0.0], [float("nan")]]), None, "NaN"),
        (torch.ones(1, 2), None, "n >= 2"),
    ],
    ids=["all-constant-x", "constant-y", "nan", "one-row"],
)
def test_fit_errors(x, y, match):
    with pytest.raises(ValueError, match=match):
        Standardizer.fit(x, y)


def test_wrong_feature_count_is_rejected(generator):
    t = Standardizer.fit(torch.randn(5, 3, generator=generator))
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        t.transform_x(torch.randn(5, 2, generator=generator))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 30), d=st.integers(1, 4), seed=st.integers(0, 2**16),
       scale=st.floats(1e-3, 1e3))
def test_property_kept_columns_standardised(n, d, seed, scale):
    """Every kept column has training mean 0 and std 1 whatever the scale of the data."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    t = Standardizer.fit(x)
    xs = t.transform_x(x)
    assert xs.shape == (n, t.num_dims)
    torch.testing.assert_close(xs.mean(0), torch.zeros(t.num_dims), rtol=0, atol=1e-9)
    torch.testing.assert_close(xs.std(0, correction=0), torch.ones(t.num_dims), rtol=0, atol=1e-9)


def test_inplace_transform_overwrites_its_input_and_equals_the_copy():
    """inplace=True standardises x itself when no column is dropped (no temporary array),
    gives what the copying path gives, and falls back to a copy when columns are dropped or
    x holds integers (means are not truncated)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=gen, dtype=torch.float64) * 4 + 2
    t = Standardizer.fit(x, None)
    expected = t.transform_x(x)
    assert expected.data_ptr() != x.data_ptr()
    work = x.clone()
    out = t.transform_x(work, inplace=True)
    assert out.data_ptr() == work.data_ptr()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out.mean(0), torch.zeros(3, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    with_constant = torch.cat([x, torch.ones(500, 1, dtype=torch.float64)], 1)
    t2 = Standardizer.fit(with_constant, None)
    kept = t2.transform_x(with_constant.clone(), inplace=True)
    assert kept.shape == (500, 3)
    torch.testing.assert_close(kept, expected, rtol=0, atol=1e-12)
    ints = torch.tensor([[1], [2], [4]])
    t3 = Standardizer.fit(ints.double(), None)
    torch.testing.assert_close(t3.transform_x(ints, inplace=True),
                               t3.transform_x(ints.double()), rtol=0, atol=1e-15)


@pytest.mark.parametrize("scale, offset", [(1e-300, 0.0), (1e-305, 0.0), (4096.0, 2.0 ** 64),
                                           (1.0, 1e15), (1e300, 0.0)],
                         ids=["1e-300", "subnormal-ish", "near 2**64", "1e15 offset", "1e300"])
def test_columns_of_any_scale_are_kept_and_standardised(scale, offset):
    """Finding 9: a spread of 1e-300 (whose square underflows) or a few units of the last place
    near 2**64 (which a plain sum loses) is not a constant column."""
    u = torch.tensor([0.0, 1.0, 2.0, 3.0, 5.0, 8.0], dtype=torch.float64)
    x = torch.stack([offset + scale * u, u], 1)
    t = Standardizer.fit(x, offset + scale * u)
    assert t.kept_columns == (0, 1)
    z = t.transform_x(x)
    expected = (u - u.mean()) / u.std(correction=0)
    torch.testing.assert_close(z[:, 0], expected, rtol=1e-12, atol=1e-12)
    # y's mean is one float64: exact to the spacing of float64 numbers at y, over y's std
    atol = 1e-12 + torch.finfo(torch.float64).eps * offset / float(t.y_std)
    torch.testing.assert_close(t.transform_y(offset + scale * u), expected, rtol=1e-12,
                               atol=atol)
    assert Standardizer.from_dict(t.to_dict()) == t
    var = torch.full((6,), 0.25, dtype=torch.float64)
    torch.testing.assert_close(t.inverse_std(var), 0.5 * scale * u.std(correction=0)
                               * torch.ones(6, dtype=torch.float64), rtol=1e-12, atol=0)


def test_constant_columns_are_still_dropped_and_an_overflowing_spread_is_named():
    x = torch.tensor([[2.0 ** 64, 1.0], [2.0 ** 64 + 1.0, 2.0]], dtype=torch.float64)
    assert Standardizer.fit(x).kept_columns == (1,)  # 2**64 + 1 == 2**64 in float64
    with pytest.raises(ValueError, match=r"x columns \[0\] are too large to standardise"):
        Standardizer.fit(torch.tensor([[-1.7e308, 0.0], [1.7e308, 1.0]], dtype=torch.float64))


def test_load_csv_warns_naming_the_dropped_columns(tmp_path):
    rows = [f"{i * 1e-300!r},{2 ** 64 + i},{i % 3}.5,{i * 0.25}" for i in range(30)]
    path = tmp_path / "d.csv"
    path.write_text("tiny,huge,c,y\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match=r"dropped the input column 'huge' \(every value "
                                         r"1\.8446744073709552e\+19\).*'huge' holds numbers of "
                                         r"magnitude 2\*\*53 or more.*subtract an offset"):
        data = load_csv(path, "y")
    assert data.info["columns"] == ["tiny", "huge", "c"] and data.transform.kept_columns == (0, 2)
    assert float(data.x_train[:, 0].std(correction=0)) == pytest.approx(1.0)
