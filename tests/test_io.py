"""gpscale.io: model files and checkpoints carry a format version and a checksum; any damaged,
foreign or mismatched file is a SavedFileError (a ValueError) naming the file."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from gpscale.errors import SavedFileError
from gpscale.files import Record, decode, encode
from gpscale.io import (
    LEGACY_FORMAT,
    convert,
    load,
    load_with_data,
    model_payload,
    payload_digest,
    read_file,
    save,
    write_file,
)
from gpscale.methods import build
from gpscale.training import FitConfig, fit


@pytest.fixture
def fitted(toy_regression):
    x, y = toy_regression
    model = build("exact", 2, init=(x, y))
    return model, (x, y)


def _predict(model, data, x_test):
    with torch.no_grad():
        pred = model.predict(model.condition(*data), x_test)
    return pred.mean, pred.variance


def test_round_trip_is_bit_identical_and_records_version(fitted, tmp_path):
    model, data = fitted
    path = save(model, tmp_path / "m.pt", data=data, info={"feature_names": ["a", "b"]})
    raw = decode(path.read_bytes())
    assert (raw["format"], raw["version"], raw["kind"]) == ("gpscale", 3, "method")
    assert len(raw["sha256"]) == 64
    saved = load_with_data(path)
    assert saved.info["feature_names"] == ["a", "b"]
    for a, b in zip(_predict(model, data, data[0]), _predict(saved.model, saved.data, data[0]),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_pickled_files_are_refused_and_convert_with_trust(fitted, tmp_path):
    """A model.pt of the pickled formats (1: 'gpscale-1'; 2: with a checksum) is refused with
    one line naming `gpscale convert`; converted with trust=True it loads and predicts alike."""
    model, data = fitted
    old = tmp_path / "old.pt"
    torch.save({"format": LEGACY_FORMAT, "kind": "method", "model": model_payload(model, data),
                "transform": None, "info": {}}, old)
    with pytest.raises(SavedFileError, match=r"old.pt: is in the pickled format .* gpscale "
                       r"convert .*old.pt NEW_FILE --trust") as err:
        load(old)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="--trust"):
        convert(old, tmp_path / "new.pt")
    assert not (tmp_path / "new.pt").exists()
    assert convert(old, tmp_path / "new.pt", trust=True) == "method"
    rebuilt = load(tmp_path / "new.pt")
    torch.testing.assert_close(_predict(rebuilt, data, data[0])[0],
                               _predict(model, data, data[0])[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="new path"):
        convert(old, old, trust=True)


# Where the pickled formats (before 2026-11-28) found the summary types that have moved since;
# an old file names each class by the module it was in then.
FORMER_MODULES = {"SoftKIPosterior": "gpscale.methods._softki_posterior",
                  "SufficientStatistics": "gpscale.methods._ski_parts",
                  "Grid": "gpscale.linalg.grid"}


@pytest.mark.parametrize("key, options", [
    ("softki", {"num_inducing": 8}),
    ("ggp", {"grid_size": [10, 9]}),
])
def test_a_pickled_summary_naming_former_modules_converts(key, options, toy_regression,
                                                          tmp_path, monkeypatch):
    """A pickled model.pt records its summary's dataclasses by the modules they lived in when
    it was written (``gpscale.methods._softki_posterior.SoftKIPosterior``, GGP's statistics in
    ``_ski_parts`` and its grid in ``gpscale.linalg.grid``). Those modules are gone (issue #45);
    the converter reads the file all the same and the model predicts alike."""
    x, y = toy_regression
    model = build(key, 2, init=(x, y), **options)
    with torch.no_grad():
        state = model.posterior(x, y)
    old = tmp_path / "old.pt"
    with monkeypatch.context() as m:  # pickle the classes under their former names
        for cls in model.summary_types:
            if (former := FORMER_MODULES.get(cls.__qualname__)) is not None:
                m.setitem(sys.modules, former, types.ModuleType(former))
                m.setattr(sys.modules[former], cls.__qualname__, cls, raising=False)
                m.setattr(cls, "__module__", former)
        torch.save({"format": LEGACY_FORMAT, "kind": "method", "transform": None, "info": {},
                    "model": model_payload(model, summary=model.summary(state))}, old)
    raw = old.read_bytes()
    named = [former for name, former in FORMER_MODULES.items()
             if f"{former}\n{name}\n".encode() in raw]
    assert len(named) == {"softki": 1, "ggp": 2}[key]
    assert convert(old, tmp_path / "new.pt", trust=True) == "method"
    saved = load_with_data(tmp_path / "new.pt")
    with torch.no_grad():
        want = model.predict(state, x)
        got = saved.model.predict(saved.state(), x)
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)
    torch.testing.assert_close(got.variance, want.variance, rtol=0, atol=0)


@pytest.mark.parametrize("value", [
    torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # not contiguous
    torch.tensor([True, False]), torch.tensor(3, dtype=torch.int64),
    torch.ones(2, dtype=torch.bfloat16), torch.tensor([1 + 2j]), torch.empty(0, 4),
    np.array(["ant", "cat"]), np.array([1, "x"], dtype=object), np.float32(2.5),
    {"nested": [1, 2.5, float("nan"), None, "s", (True, b"raw")]},
    torch.Generator().manual_seed(3).get_state(),
], ids=lambda v: type(v).__name__)
def test_digest_survives_save_and_load(value):
    again = decode(encode({"v": value}))
    assert payload_digest(again) == payload_digest({"v": value})


def test_digest_sees_any_change():
    base = {"w": torch.zeros(4), "lr": 0.1, "names": ["a", "b"]}
    digest = payload_digest(base)
    for changed in ({**base, "w": torch.tensor([0.0, 0.0, 1e-30, 0.0])}, {**base, "lr": 0.2},
                    {**base, "names": ["a", "c"]}, {**base, "w": torch.zeros(2, 2)},
                    {**base, "w": torch.zeros(4, dtype=torch.float32)},
                    {**base, "names": ("a", "b")}):
        assert payload_digest(changed) != digest


def test_every_overwritten_block_is_detected_or_harmless(fitted, tmp_path):
    """200 bytes overwritten anywhere: a SavedFileError, or (zip padding) the same payload."""
    model, data = fitted
    path = save(model, tmp_path / "m.pt", data=data)
    raw = path.read_bytes()
    want = payload_digest(read_file(path, ("method",)))
    damaged = tmp_path / "d.pt"
    for start in range(0, len(raw), 97):
        block = bytearray(raw)
        block[start:start + 200] = bytes((i * 7 + start) % 256 for i in range(200))[
            :len(block[start:start + 200])]
        damaged.write_bytes(bytes(block))
        try:
            payload = read_file(damaged, ("method",))
        except SavedFileError as err:
            assert str(err).startswith(str(damaged)) and "\n" not in str(err)
            continue
        assert payload_digest(payload) == want


def test_every_truncation_is_detected(fitted, tmp_path):
    model, data = fitted
    raw = save(model, tmp_path / "m.pt", data=data).read_bytes()
    cut = tmp_path / "cut.pt"
    for size in [0, 1, 10, *range(64, len(raw), max(len(raw) // 40, 1))]:
        cut.write_bytes(raw[:size])
        with pytest.raises(SavedFileError, match="cut.pt: "):
            load(cut)


@pytest.mark.parametrize(("payload", "match"), [
    ({"format": "gpscale", "version": 99, "kind": "method"}, "format version 99"),
    ([1, 2, 3], "not a gpscale file"),
    ({"format": "other"}, "not a gpscale file"),
], ids=["newer-version", "list", "other-format"])
def test_foreign_or_newer_files(payload, match, tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(encode(payload))
    with pytest.raises(SavedFileError, match=match):
        load(path)
    torch.save(payload, path)  # any pickle: refused before it is unpickled
    with pytest.raises(SavedFileError, match="pickled format"):
        load(path)


def test_wrong_kind_and_unrebuildable_payload(fitted, tmp_path):
    model, data = fitted
    ckpt = write_file(tmp_path / "c.pt", "checkpoint", {"epoch": 1})
    with pytest.raises(SavedFileError, match="holds a training checkpoint, not a saved model"):
        load(ckpt)
    payload = model_payload(model, data)
    payload["state_dict"] = {k: v[..., :0] if v.dim() else v
                             for k, v in payload["state_dict"].items()}
    bad = write_file(tmp_path / "bad.pt", "method",
                     {"model": payload, "transform": None, "info": {}})
    with pytest.raises(SavedFileError, match="bad.pt: holds a model that cannot be rebuilt"):
        load(bad)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.pt")


# -- checkpoints ----------------------------------------------------------------------------------

class Line(nn.Module):
    def __init__(self, width: int = 1):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(width))


def _loss(model, x, y):
    return ((x[:, :model.w.shape[0]] @ model.w - y) ** 2).mean()


def _data(seed: int = 0, n: int = 30):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x[:, 0] * 2 + 0.1 * torch.randn(n, generator=g)


def _config(path, **kw):
    return FitConfig(lr=0.1, epochs=3, progress=False, checkpoint=str(path), **kw)


@pytest.mark.parametrize(("second", "match"), [
    (dict(data=_data(seed=1)), "other training data of the same shape"),
    (dict(data=_data(n=20)), r"training data of shape \(30, 2\)"),
    (dict(model=Line(2)), r"w has shape \(1,\) there, \(2,\) here"),
    (dict(optimizer="lbfgs"), "optimiser Adam; this run uses LBFGS"),
], ids=["other-data", "other-shape", "other-parameters", "other-optimiser"])
def test_fit_refuses_a_checkpoint_of_another_run(second, match, tmp_path):
    ckpt = tmp_path / "c.pt"
    fit(Line(), _loss, _data(), _config(ckpt))
    before = ckpt.read_bytes()
    config = _config(ckpt, optimizer=second.get("optimizer", "adam"))
    with pytest.raises(SavedFileError, match=match):
        fit(second.get("model", Line()), _loss, second.get("data", _data()), config)
    assert ckpt.read_bytes() == before


def test_a_pickled_checkpoint_is_refused_and_resumes_once_converted(tmp_path):
    """A checkpoint of the first format (a bare pickled dict) is refused untouched; converted
    with trust it resumes."""
    ckpt = tmp_path / "c.pt"
    fit(Line(), _loss, _data(), _config(ckpt))
    state = decode(ckpt.read_bytes())
    legacy = {k: v for k, v in state.items() if k not in ("format", "version", "kind", "sha256",
                                                         "run")}
    torch.save(legacy, ckpt)
    before = ckpt.read_bytes()
    with pytest.raises(SavedFileError, match="gpscale convert"):
        fit(Line(), _loss, _data(), _config(ckpt).updated(epochs=5))
    assert ckpt.read_bytes() == before
    assert convert(ckpt, tmp_path / "new.pt", trust=True) == "checkpoint"
    history = fit(Line(), _loss, _data(), _config(tmp_path / "new.pt").updated(epochs=5))
    assert history.column("epoch") == [1, 2, 3, 4, 5]


def test_fit_reports_a_damaged_checkpoint(tmp_path):
    ckpt = tmp_path / "c.pt"
    fit(Line(), _loss, _data(), _config(ckpt))
    raw = bytearray(ckpt.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 200] = bytes(200)
    ckpt.write_bytes(bytes(raw))
    with pytest.raises(SavedFileError, match="c.pt: "):
        fit(Line(), _loss, _data(), _config(ckpt).updated(epochs=5))


# -- fields of the wrong type (a checksum-valid file anyone can write) ----------------------------

def _edit(path, change):
    """``path`` rewritten with ``change(payload)`` applied and its checksum recomputed."""
    payload = read_file(path, ("method",))
    for key in ("format", "version", "kind"):
        payload.pop(key)
    change(payload)
    return write_file(path.with_name("edited.pt"), "method", payload)


def _set(*keys, value):
    def change(payload):
        target = payload
        for key in keys[:-1]:
            target = target[key]
        if value is _DROP:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value
    return change


_DROP = object()
_NAN = float("nan")


@pytest.mark.parametrize(("change", "match"), [
    (_set("model", "data", value="abc"), "its field 'model.data' holds a str"),
    (_set("model", "data", value=lambda d: (d[0],)), "its field 'model.data' holds a tuple"),
    (_set("model", "data", value=lambda d: (d[0] * _NAN, d[1])),
     "its field 'model.data' holds NaN or inf in x"),
    (_set("model", "data", value=lambda d: (d[0][:, :1], d[1])),
     r"its field 'model.data' holds x of shape \(40, 1\)"),
    (_set("model", "options", value="abc"), "its field 'model.options' holds a str"),
    (_set("model", "state_dict", "likelihood.noise_covar.raw_noise",
          value=lambda t: t * _NAN),
     "its parameter 'likelihood.noise_covar.raw_noise' holds NaN or inf"),
    (_set("model", "state_dict", "kernel.raw_outputscale", value=lambda t: t * float("inf")),
     "its parameter 'kernel.raw_outputscale' holds NaN or inf"),
    (_set("transform", value="abc"), "its field 'transform' holds a str"),
    (_set("transform", "x_std", value=_DROP), "its field 'transform.x_std' is missing"),
    (_set("transform", "x_mean", value=["a", 0.0]),
     "its field 'transform.x_mean' holds a list, not a list of finite numbers"),
    (_set("transform", "y_std", value=_NAN),
     "its field 'transform.y_std' holds a float, not a positive number"),
    (_set("transform", "kept_columns", value=[0]),
     "its field 'transform' standardises 1 of 2 input columns"),
    (_set("info", value=[1]), "its field 'info' holds a list"),
    (_set("info", "feature_names", value=5), "its field 'info.feature_names' holds an int"),
    (_set("info", "feature_names", value="ab"), "its field 'info.feature_names' holds a str"),
    (_set("info", "feature_names", value=["a", 1]),
     "its field 'info.feature_names' holds a list, not a list of column names"),
    (_set("info", "num_features", value="2"), "its field 'info.num_features' holds a str"),
    (_set("info", "classes", value=5), "its field 'info.classes' holds an int"),
], ids=["data-text", "data-one-tensor", "data-nan", "data-shape", "options-text",
        "nan-parameter", "inf-parameter", "transform-text", "transform-missing",
        "transform-text-mean", "transform-nan", "transform-columns", "info-list",
        "feature-names-int", "feature-names-text", "feature-names-mixed", "num-features-text",
        "classes-int"])
def test_a_field_of_the_wrong_type_is_refused_at_load_naming_it(fitted, tmp_path, change,
                                                                 match):
    """Probe finding: checksum-valid files with ill-typed fields (model.data, transform,
    info, feature_names, a NaN parameter) loaded, then `predict` failed with a traceback."""
    model, data = fitted
    transform = {"x_mean": [0.1, -0.2], "x_std": [1.5, 2.0], "kept_columns": [0, 1],
                 "num_input_dims": 2, "y_mean": 0.3, "y_std": 1.2, "x_mean_low": [0.0, 0.0]}
    info = {"feature_names": ["a", "b"], "num_features": 2, "target_name": "y"}
    path = _edit(save(model, tmp_path / "m.pt", data=data, transform=transform, info=info),
                 change)
    for loader in (load, load_with_data):
        with pytest.raises(SavedFileError, match=f"^{path}: {match}") as err:
            loader(path)
        assert "\n" not in str(err.value)


def _softki_file(tmp_path, toy_regression):
    x, y = toy_regression
    model = build("softki", 2, init=(x, y), num_inducing=8).double()
    with torch.no_grad():
        summary = model.summary(model.posterior(x, y))
    return save(model, tmp_path / "m.pt", summary=summary)


def _summary_field(name, value):
    def change(payload):
        record = payload["model"]["summary"]
        payload["model"]["summary"] = Record(record.type, {**record.fields, name: value})
    return change


@pytest.mark.parametrize(("change", "match"), [
    (_set("model", "summary", value=None),
     "its fields 'model.data' and 'model.summary' are both empty; method 'softki'"),
    (_set("model", "summary", value="abc"),
     "its field 'model.summary' holds a str, not SoftKIPosterior"),
    (_summary_field("R", "abc"), "its field 'model.summary.R' holds a str, not Tensor"),
], ids=["none", "text", "field-text"])
def test_a_softki_summary_that_is_not_one_is_refused_at_load(tmp_path, toy_regression, change,
                                                             match):
    """Probe finding: a SoftKI file whose summary was None loaded, then `predict` failed."""
    path = _edit(_softki_file(tmp_path, toy_regression), change)
    for loader in (load, load_with_data):
        with pytest.raises(SavedFileError, match=f"^{path}: {match}"):
            loader(path)


def test_a_saved_state_that_cannot_be_conditioned_on_names_the_file(tmp_path, toy_regression):
    """A SoftKI summary refused by its model (parameters changed after it was computed) is
    reported naming the file, like every other problem of a model file."""
    path = _softki_file(tmp_path, toy_regression)
    saved = load_with_data(path)
    with torch.no_grad():
        saved.model.kernel.base_kernel.raw_lengthscale.add_(0.1)
    with pytest.raises(SavedFileError, match=f"^{path}: its summary of its training data cannot "
                                             "be conditioned on: .*other parameters"):
        saved.state()
