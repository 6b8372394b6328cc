"""Models that summarise their data predict without it: SoftKI keeps its m-sized posterior, GGP
its sufficient statistics (``Method.summary`` / ``Method.from_summary``, ``model.pt``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpscale.io import load_with_data, save
from gpscale.methods import build


def _data(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(4 * x).sum(1) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _softki(x, y, **kw):
    return build("softki", x.shape[1], init=(x, y), num_inducing=24, **kw).double()


def _same(a, b, tol=1e-10):
    torch.testing.assert_close(a.mean, b.mean, rtol=tol, atol=tol)
    torch.testing.assert_close(a.variance, b.variance, rtol=tol, atol=tol)


@pytest.mark.parametrize("chunk_size", [1000, 97])
def test_softki_posterior_streams_and_predicts_as_condition(chunk_size):
    """The streamed posterior (TSQR over chunks of W Uᵀ) predicts as the training state does,
    and holds nothing of size n."""
    x, y = _data(1500, 3)
    model = _softki(x, y, chunk_size=chunk_size)
    x_test = _data(200, 3, seed=1)[0]
    with torch.no_grad():
        full, post = model.condition(x, y), model.posterior(x, y)
        _same(model.predict(post, x_test), model.predict(full, x_test))
    sizes = {f.name: tuple(getattr(post, f.name).shape) for f in dataclasses.fields(post)
             if isinstance(getattr(post, f.name), torch.Tensor)}
    assert all(1500 not in shape for shape in sizes.values()), sizes


def test_softki_saved_summary_predicts_identically_and_is_refused_after_a_change(tmp_path):
    x, y = _data(800, 2)
    model = _softki(x, y)
    x_test = _data(100, 2, seed=1)[0]
    with torch.no_grad():
        state = model.posterior(x, y)
        ref = model.predict(state, x_test)
    save(model, tmp_path / "m.pt", summary=model.summary(state))
    saved = load_with_data(tmp_path / "m.pt")
    assert saved.data is None
    with torch.no_grad():
        _same(saved.model.predict(saved.state(), x_test), ref, tol=0)
        saved.model.kernel.base_kernel.raw_lengthscale.add_(0.1)  # "trained further"
    with pytest.raises(ValueError, match="other parameters"):
        saved.state()


def test_softki_summarises_only_a_posterior():
    x, y = _data(200, 2)
    model = _softki(x, y)
    with torch.no_grad(), pytest.raises(TypeError, match="posterior"):
        model.summary(model.condition(x, y))


def test_ggp_saved_statistics_predict_identically_and_do_not_grow_with_n(tmp_path):
    """model.pt of GGP holds the statistics: the same size for n = 2,000 and 40,000 points,
    and the reloaded model predicts as the one that saw the data."""
    x_test = _data(150, 2, seed=1)[0]
    size = {}
    for n in (2000, 40_000):
        x, y = _data(n, 2)
        model = build("ggp", 2, init=(x, y), grid_size=24).double()
        with torch.no_grad():
            state = model.posterior(x, y)
            ref = model.predict(state, x_test)
        path = save(model, tmp_path / f"ggp{n}.pt", summary=model.summary(state))
        size[n] = path.stat().st_size
        saved = load_with_data(path)
        assert saved.data is None
        with torch.no_grad():
            _same(saved.model.predict(saved.state(), x_test), ref)
    assert size[40_000] < 1.02 * size[2000], size
    # the data would have been 40,000 × 3 float64 = 960 kB
    assert size[40_000] < 40_000 * 3 * 8 / 2, size


def test_methods_that_keep_their_data_have_no_summary():
    x, y = _data(100, 2)
    model = build("exact", 2, init=(x, y)).double()
    with torch.no_grad():
        assert model.summary(model.posterior(x, y)) is None
    with pytest.raises(NotImplementedError, match="keeps its training data"):
        model.from_summary(None)
