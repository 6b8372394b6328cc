"""The kernel's reach (gpscale.linalg.reach): far rows are found, parked and never move the
shift, in either point set (issue #46)."""

from __future__ import annotations

import math

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.linalg.reach import FAR_SQDIST, batched, beyond_box, box_sqdist, centre, park


@pytest.mark.parametrize("profile", list(DENSE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_profile_is_exactly_zero_from_the_far_distance(profile, dtype):
    r = torch.tensor([math.sqrt(FAR_SQDIST), 2 * math.sqrt(FAR_SQDIST)], dtype=dtype)
    assert DENSE[profile](r).tolist() == [0.0, 0.0]


def test_box_distance_is_a_lower_bound_and_overflows_to_infinity(generator):
    s = torch.randn(20, 3, generator=generator, dtype=torch.float64) * 3
    lower, upper = torch.tensor([-1.0, 0.0, -2.0]), torch.tensor([1.0, 0.5, 2.0])
    inside = torch.rand(500, 3, generator=generator, dtype=torch.float64) * (upper - lower) + lower
    points = torch.cat([lower[None], upper[None], inside])
    bound = box_sqdist(s, lower, upper)
    assert (bound[:, None] <= torch.cdist(s, points).square() + 1e-12).all()
    assert box_sqdist(torch.tensor([[1e200, 0.0, 0.0]]), lower, upper).item() == math.inf


@pytest.mark.parametrize("far_in", ["x1", "x2"])
@pytest.mark.parametrize("place", [0, 3, 9])
def test_centre_parks_far_rows_of_either_set(far_in, place, generator):
    """A row at 10⁸ or 10²⁰⁰ in either set is marked, parked on the shift, and leaves the other
    rows' scaled coordinates as without it (to the rounding of the mean that is the shift)."""
    ell = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    x1 = torch.randn(9, 2, generator=generator, dtype=torch.float64)
    x2 = torch.randn(12, 2, generator=generator, dtype=torch.float64) + 0.5
    alone = centre(x1, x2, ell)
    assert alone.keep1 is None and alone.keep2 is None  # nothing can be beyond reach: no masks
    for value in (1e8, 1e200):
        row = torch.tensor([[value, -value]], dtype=torch.float64)
        if far_in == "x1":
            got = centre(torch.cat([x1[:place], row, x1[place:]]), x2, ell)
            keep, z, others = got.keep1, got.z1, torch.cat([got.z1[:place], got.z1[place + 1:]])
            torch.testing.assert_close(others, alone.z1, rtol=0, atol=1e-14)
            torch.testing.assert_close(got.z2, alone.z2, rtol=0, atol=1e-14)
        else:
            got = centre(x1, torch.cat([x2[:place], row, x2[place:]]), ell)
            keep, z, others = got.keep2, got.z2, torch.cat([got.z2[:place], got.z2[place + 1:]])
            torch.testing.assert_close(others, alone.z2, rtol=0, atol=1e-14)
            torch.testing.assert_close(got.z1, alone.z1, rtol=0, atol=1e-14)
        assert keep.tolist() == [i != place for i in range(keep.shape[0])]
        assert z[place].abs().max() == 0.0  # parked on the shift


def test_masks_on_sets_within_reach_keep_every_row(generator):
    """Forced onto the masked path (as on a GPU), sets within reach keep all rows and the
    coordinates of the unmasked path."""
    ell = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    x1 = torch.randn(9, 2, generator=generator, dtype=torch.float64)
    x2 = torch.randn(12, 2, generator=generator, dtype=torch.float64)
    plain = centre(x1, x2, ell)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpscale.linalg.reach._all_within_reach", lambda *args: False)
        masked = centre(x1, x2, ell)
    assert masked.keep1.all() and masked.keep2.all()
    torch.testing.assert_close(masked.z1, plain.z1, rtol=0, atol=1e-14)
    torch.testing.assert_close(masked.z2, plain.z2, rtol=0, atol=1e-14)


def test_centre_of_one_set_is_its_mean_and_keeps_everything(generator):
    x = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    z1, z2, keep1, keep2 = centre(x, x, torch.tensor([[2.0]], dtype=torch.float64))
    assert z1 is z2 and keep1 is None and keep2 is None
    torch.testing.assert_close(z1, (x - x.mean(0)) / 2.0)


def test_batched_lengthscales_mark_rows_per_member(generator):
    """A row 50 units away is beyond reach for a lengthscale of 0.01, within it for 1000."""
    ell = torch.tensor([[[0.01]], [[1000.0]]], dtype=torch.float64)  # (2, 1, 1)
    x1 = torch.tensor([[0.0], [50.0]], dtype=torch.float64)
    x2 = torch.tensor([[0.1], [-0.2]], dtype=torch.float64)
    z1, z2, rhs, batch, keep1, keep2 = batched(x1, x2, torch.ones(2, 1, dtype=torch.float64),
                                               ell, torch.Size())
    assert batch == (2,) and z1.shape == (2, 2, 1) and rhs.shape == (2, 2, 1)
    assert keep1.tolist() == [[True, False], [True, True]] and keep2.all()


def test_park_moves_far_rows_to_one_finite_point_beyond_reach(generator):
    reference = torch.randn(3, 8, 2, generator=generator, dtype=torch.float64)  # (L, m, d)
    ell = torch.tensor([[[0.5, 2.0]], [[1.0, 1.0]], [[3.0, 0.1]]], dtype=torch.float64)
    x = torch.tensor([[0.1, 0.2], [1e8, 0.0], [-1e200, 1e200], [1e3, 0.0]], dtype=torch.float64)
    parked = park(x, reference, ell)
    assert torch.equal(parked[0], x[0]) and torch.isfinite(parked).all()
    assert torch.equal(parked[1], parked[2])  # one spot for every far row
    # 1000 is within reach of the lengthscale 3 (1000 / 3 < 1000): it stays
    assert torch.equal(parked[3], x[3])
    lower, upper = reference.reshape(-1, 2).amin(0), reference.reshape(-1, 2).amax(0)
    assert beyond_box(parked[1:3], lower, upper, ell).all()
