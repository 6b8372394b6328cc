"""The data set registry and loaders: UCI regression sets, MNIST, CIFAR-10, the synthetic sets.

Files are found on the search path (:func:`search_path`): the folders in ``$GPSCALE_DATA``
(``os.pathsep``-separated), then ``~/.cache/gpscale``. Layout under a root:
``uci/<name>/data.csv.gz`` (no header, last column = target) with ``test_mask.csv.gz`` (10 columns,
column s = 1 marks the test rows of split s), and ``mnist/t10k-{images-idx3,labels-idx1}-ubyte.gz``.

Preprocessing:

- UCI: split s selects mask column s; columns constant on the training rows are dropped; x and y
  are standardised with training statistics only (:class:`Standardizer`, kept in
  ``Dataset.transform`` to map predictions back).
- MNIST: x = pixels / 255 in [0, 1], labels int64 0..9, no standardisation and no column dropping.
  The pixels already share one bounded scale, and per-pixel standardisation would divide the
  many border pixels that are (almost) always 0 by a near-zero standard deviation, inflating noise,
  and would make the feature set depend on the subset; kernel hyperparameters quoted for MNIST
  (notes/000 §11.4) refer to this raw scale. Train and test points are both drawn from the 10k
  test set by a permutation seeded with ``seed + split``.
- CIFAR-10 (``cifar10``): the user's copy of the official binary batches in
  ``cifar-10-batches-bin/`` (:mod:`gpscale.data.cifar`; the pickled Python distribution is
  refused, naming its folder), x = pixels / 255 as MNIST, rows channel-last (32 · 32 · 3).
- Synthetic sets (:mod:`gpscale.data.synthetic`) are returned on their natural scale, drawn with
  seed ``seed + split`` (so split s of seed 0 is the draw with seed s).

Loader options (``--data-option KEY=VALUE``: sizes, noise, ...) are declared per entry
(``DatasetEntry.options``) and checked by :func:`gpscale.data.options.check_data_options`
before the loader runs: an unknown option or a value of the wrong kind or range is a
``ValueError`` that lists the valid ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import gpscale.data.synthetic as synthetic
from gpscale.data.cifar import CIFAR_FOLDER, CIFAR_TEST, CIFAR_TRAIN, REFUSED, read_cifar_batch
from gpscale.data.download import REMOTE_FILES, FileSpec, default_cache_dir
from gpscale.data.mnist import MNIST_IMAGES, MNIST_LABELS, read_idx
from gpscale.data.options import DataOption, check_data_options, sizes
from gpscale.data.splits import uci_split
from gpscale.data.transforms import Standardizer

__all__ = ["TASKS", "Dataset", "DatasetEntry", "DatasetInfo", "DATASETS", "ALIASES",
           "search_path", "get_entry", "load_dataset", "list_datasets", "standardized_dataset"]

TASKS = ("regression", "classification", "counts")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split ready for a model.

    Attributes:
        name: registry name or file stem.
        x_train: (n, d) float.  y_train: (n,) float (regression, counts) or int64 labels.
        x_test: (t, d).  y_test: (t,).
        task: ``"regression"``, ``"classification"`` or ``"counts"``.
        num_classes: C for classification (labels are 0..C-1), else ``None``.
        transform: the :class:`Standardizer` that produced x and y, or ``None`` (raw data).
        info: provenance (source path or ``"generated"``, split, seed, dropped columns, ...).
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    task: str = "regression"
    num_classes: int | None = None
    transform: Standardizer | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid tasks: {', '.join(TASKS)}")
        for x, y, part in ((self.x_train, self.y_train, "train"),
                           (self.x_test, self.y_test, "test")):
            if x.dim() != 2 or y.dim() != 1 or x.shape[0] != y.shape[0]:
                raise ValueError(f"{part} set needs x (n, d) and y (n,); got "
                                 f"{tuple(x.shape)} and {tuple(y.shape)}")
        if self.x_train.shape[1] != self.x_test.shape[1]:
            raise ValueError(f"x_train has {self.x_train.shape[1]} columns, x_test "
                             f"{self.x_test.shape[1]}")
        if (self.task == "classification") != (self.num_classes is not None):
            raise ValueError("num_classes must be given for classification and only then")

    @property
    def num_dims(self) -> int:
        return self.x_train.shape[1]

    @property
    def num_train(self) -> int:
        return self.x_train.shape[0]

    @property
    def num_test(self) -> int:
        return self.x_test.shape[0]


Loader = Callable[..., Dataset]


@dataclass(frozen=True)
class DatasetEntry:
    """A registry entry.

    Attributes:
        name: the key users type.
        task: see :data:`TASKS`.
        n: total number of points (train + test) in the default configuration.
        d: number of input columns as stored (before constant columns are dropped).
        description: one line for listings.
        loader: ``loader(entry, folder, *, split, seed, dtype, **kwargs) -> Dataset``; ``folder``
            is where the files were found, ``None`` for generated sets.
        files: the remote files (URLs and SHA-256), empty for generated sets.
        num_classes: C for classification.
        options: the loader's keyword options, declared (none for the UCI sets).
        refused: folders (beside this set's) holding a distribution gpscale will not read,
            with the reason, for the not-found error (CIFAR-10's pickles).
    """

    name: str
    task: str
    n: int
    d: int
    description: str
    loader: Loader
    files: tuple[FileSpec, ...] = ()
    num_classes: int | None = None
    options: tuple[DataOption, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)

    @property
    def folder(self) -> str | None:
        """The folder (relative to a root) holding the files, e.g. ``"uci/yacht"``."""
        return self.files[0].path.rsplit("/", 1)[0] if self.files else None


@dataclass(frozen=True)
class DatasetInfo:
    """What :func:`list_datasets` reports; ``location`` is a folder, ``"generated"`` or None."""

    name: str
    task: str
    n: int
    d: int
    present: bool
    location: str | None
    description: str = ""
    aliases: tuple[str, ...] = ()


def standardized_dataset(name: str, x: Tensor, y: Tensor, train_idx: Tensor, test_idx: Tensor,
                         *, task: str = "regression", num_classes: int | None = None,
                         dtype: torch.dtype = torch.float64,
                         info: dict[str, Any] | None = None,
                         standardize_x: bool = True) -> Dataset:
    """Split rows, fit a :class:`Standardizer` on the training rows only, and apply it.

    x is standardised for every task (unless ``standardize_x`` is false: images); y only for
    regression (labels and counts stay as they are). Columns constant on the training rows are
    dropped and listed in ``info`` (none when x is not standardised).
    """
    x_train, x_test = x[train_idx], x[test_idx]
    y_train, y_test = y[train_idx], y[test_idx]
    transform = Standardizer.fit(x_train, y_train, standardize_y=task == "regression",
                                 standardize_x=standardize_x)
    if task != "classification":
        y_train, y_test = transform.transform_y(y_train).to(dtype), \
            transform.transform_y(y_test).to(dtype)
    info = {**(info or {}), "dropped_columns": list(transform.dropped_columns)}
    # x_train and x_test are this function's own copies: standardised in place, so that peak
    # memory is x plus its two parts (a 10^7-row file: about twice the array, not four times)
    return Dataset(name, transform.transform_x(x_train, inplace=True).to(dtype), y_train,
                   transform.transform_x(x_test, inplace=True).to(dtype), y_test, task=task,
                   num_classes=num_classes, transform=transform, info=info)


def _load_uci(entry: DatasetEntry, folder: Path, *, split: int, seed: int,
              dtype: torch.dtype) -> Dataset:
    data = np.loadtxt(folder / "data.csv.gz", delimiter=",", ndmin=2)
    train_idx, test_idx = uci_split(folder / "test_mask.csv.gz", split)
    num_rows = int(train_idx.numel() + test_idx.numel())
    if num_rows != data.shape[0]:
        raise ValueError(f"{folder}: test_mask.csv.gz has {num_rows} rows but data.csv.gz "
                         f"has {data.shape[0]}")
    table = torch.from_numpy(data)
    info = {"source": str(folder), "split": split, "seed": seed}
    return standardized_dataset(entry.name, table[:, :-1], table[:, -1], train_idx, test_idx,
                                task="regression", dtype=dtype, info=info)


def _check_split(split: int) -> None:
    if split < 0:
        raise ValueError(f"split must be a non-negative integer; got {split}")


def _load_mnist(entry: DatasetEntry, folder: Path, *, split: int, seed: int, dtype: torch.dtype,
                num_train: int = 8000, num_test: int = 2000) -> Dataset:
    _check_split(split)
    images, labels = read_idx(folder / MNIST_IMAGES), read_idx(folder / MNIST_LABELS)
    n = images.shape[0]
    if labels.shape != (n,):
        raise ValueError(f"{folder}: {n} images but labels of shape {labels.shape}")
    if num_train < 1 or num_test < 1 or num_train + num_test > n:
        raise ValueError(f"need num_train >= 1, num_test >= 1 and num_train + num_test <= {n}; "
                         f"got {num_train} and {num_test}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + split))
    x = torch.from_numpy(images.reshape(n, -1).astype(np.float64) / 255.0).to(dtype)
    y = torch.from_numpy(labels.astype(np.int64))
    train, test = perm[:num_train], perm[num_train:num_train + num_test]
    info = {"source": str(folder), "split": split, "seed": seed,
            "permutation_seed": seed + split, "pixel_scale": "x = pixel / 255"}
    return Dataset(entry.name, x[train], y[train], x[test], y[test], task="classification",
                   num_classes=10, info=info)


def _load_cifar10(entry: DatasetEntry, folder: Path, *, split: int, seed: int,
                  dtype: torch.dtype, num_train: int = 50_000, num_test: int = 10_000) -> Dataset:
    """The official training and test batches; ``num_train`` / ``num_test`` take a seeded
    random subset of each (split added to the seed). x = pixel / 255, channel-last rows."""
    _check_split(split)
    parts = [read_cifar_batch(folder / name) for name in CIFAR_TRAIN]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = read_cifar_batch(folder / CIFAR_TEST)
    g = torch.Generator().manual_seed(seed + split)

    def subset(x: np.ndarray, y: np.ndarray, count: int, what: str) -> tuple[Tensor, Tensor]:
        if count > x.shape[0]:
            raise ValueError(f"{what}: {count} asked for, the batches hold {x.shape[0]}")
        rows = torch.randperm(x.shape[0], generator=g)[:count].sort().values.numpy()
        images = torch.from_numpy(x[rows].reshape(count, -1).astype(np.float64) / 255.0)
        return images.to(dtype), torch.from_numpy(y[rows])

    xs, ys = subset(x_train, y_train, num_train, "num_train")
    xt, yt = subset(x_test, y_test, num_test, "num_test")
    info = {"source": str(folder), "split": split, "seed": seed,
            "pixel_scale": "x = pixel / 255", "image_shape": [32, 32, 3]}
    return Dataset(entry.name, xs, ys, xt, yt, task="classification", num_classes=10, info=info)


def _synthetic_loader(generate: Callable[..., synthetic.SyntheticData],
                      **defaults: Any) -> Loader:
    """Wrap a generator: keyword overrides replace ``defaults``; ``n`` means ``num_train``."""

    def load(entry: DatasetEntry, folder: Path | None, *, split: int, seed: int,
             dtype: torch.dtype, **kwargs: Any) -> Dataset:
        _check_split(split)
        if "n" in kwargs:
            kwargs["num_train"] = kwargs.pop("n")
        params = {**defaults, **kwargs}
        data = generate(seed=seed + split, **params)
        float_y = entry.task != "classification"
        y_train = data.y_train.to(dtype) if float_y else data.y_train
        y_test = data.y_test.to(dtype) if float_y else data.y_test
        info = {"source": "generated", "generator": generate.__name__, "split": split,
                "seed": seed, "params": params}
        return Dataset(entry.name, data.x_train.to(dtype), y_train, data.x_test.to(dtype),
                       y_test, task=entry.task, num_classes=entry.num_classes, info=info)

    return load


_UCI = {  # name: (n, d, description)
    "airfoil": (1503, 5, "NASA airfoil self-noise"),
    "bike": (17379, 17, "bike sharing, hourly rental counts"),
    "concrete": (1030, 8, "concrete compressive strength"),
    "elevators": (16599, 18, "F16 aircraft elevator control"),
    "energy": (768, 8, "energy efficiency of buildings"),
    "housing": (506, 13, "Boston housing prices"),
    "keggundirected": (63608, 27, "KEGG metabolic pathways, undirected network"),
    "kin40k": (40000, 8, "robot arm forward kinematics"),
    "parkinsons": (5875, 20, "Parkinson's telemonitoring"),
    "protein": (45730, 9, "protein tertiary structure (CASP)"),
    "skillcraft": (3338, 19, "StarCraft II player skill"),
    "wine": (1599, 11, "red wine quality"),
    "yacht": (308, 6, "yacht hydrodynamics"),
}
_POSITIVE = {"minimum": 0, "exclusive": True}
_KERNEL = (DataOption("lengthscale", "float", "RBF lengthscale of the GP draw", **_POSITIVE),
           DataOption("outputscale", "float", "variance of the GP draw", **_POSITIVE))
_NOISE = DataOption("noise", "float", "noise variance", minimum=0)
_DIMS = DataOption("num_dims", "int", "input dimensions", minimum=1)
_BINARY = (*sizes(), DataOption("bounds", "box", "input box, one [low, high] per dimension"),
           *_KERNEL)
_GENERATED = (
    DatasetEntry("binary1d", "classification", 250, 1, "GP-draw binary labels, 1-D (50 train)",
                 _synthetic_loader(synthetic.binary_classification), num_classes=2,
                 options=_BINARY),
    DatasetEntry("binary2d", "classification", 500, 2, "GP-draw binary labels, 2-D (100 train)",
                 _synthetic_loader(synthetic.binary_classification, num_train=100,
                                   num_test=400, bounds=((-3.0, 5.0), (-4.0, 1.0)),
                                   outputscale=10.0), num_classes=2, options=_BINARY),
    DatasetEntry("poisson1d", "counts", 200, 1, "Poisson counts, GP log-rate on [0, 1]",
                 _synthetic_loader(synthetic.poisson_counts),
                 options=(*sizes(), *_KERNEL, DataOption(
                     "function_seed", "int", "seed of the log-rate draw", minimum=0))),
    DatasetEntry("gmm10", "classification", 30_000, 3, "10-class 3-D Gaussian mixture",
                 _synthetic_loader(synthetic.gaussian_mixture, num_train_per_class=2000,
                                   num_test_per_class=1000), num_classes=10,
                 options=(DataOption("num_train_per_class", "int", "training points per class",
                                     minimum=1),
                          DataOption("num_test_per_class", "int", "test points per class",
                                     minimum=1),
                          _DIMS,
                          DataOption("mixture_seed", "int", "seed of the mixture's Gaussians",
                                     minimum=0))),
    DatasetEntry("sine", "regression", 2000, 1, "noisy sine, two periods on [0, 1]",
                 _synthetic_loader(synthetic.noisy_sine), options=(*sizes(), _NOISE)),
    DatasetEntry("field3d", "regression", 110_000, 3, "smooth random field on [0, 1]^3",
                 _synthetic_loader(synthetic.field_dataset),
                 options=(*sizes(), _DIMS, _NOISE,
                          DataOption("lengthscale", "float", "the field's RBF lengthscale",
                                     **_POSITIVE),
                          DataOption("num_features", "int", "random features of the field",
                                     minimum=1),
                          DataOption("field_seed", "int", "seed of the field", minimum=0),
                          DataOption("chunk_size", "int", "points drawn per chunk",
                                     minimum=1))),
    DatasetEntry("synthetic", "regression", 4000, 1, "1-D sum of sines with a gap (demo)",
                 _synthetic_loader(synthetic.demo_regression),
                 options=(*sizes(), _NOISE, DataOption(
                     "gap", "interval", "the interval of [0, 10] without training points"))),
    DatasetEntry("additive12", "regression", 1_100_000, 12,
                 "12 inputs, a sum of six 1-D and three 2-D parts (additive GGP)",
                 _synthetic_loader(synthetic.additive_parts), options=(*sizes(), _NOISE)),
    DatasetEntry("projections128", "regression", 2_500, 128,
                 "128 inputs, 10 of them through random projections (few rows, many inputs)",
                 _synthetic_loader(synthetic.projections),
                 options=(*sizes(), _NOISE,
                          DataOption("num_dims", "int", "input dimensions", minimum=10))),
    DatasetEntry("relevant32", "regression", 10_000, 32, "32 inputs of which 4 matter (ARD)",
                 _synthetic_loader(synthetic.few_relevant_inputs),
                 options=(*sizes(), _NOISE,
                          DataOption("num_dims", "int", "input dimensions", minimum=2),
                          DataOption("num_relevant", "int", "inputs the function depends on",
                                     minimum=2))),
)
DATASETS: dict[str, DatasetEntry] = {
    **{name: DatasetEntry(name, "regression", n, d, f"UCI: {text}", _load_uci,
                          REMOTE_FILES[name]) for name, (n, d, text) in _UCI.items()},
    "mnist": DatasetEntry("mnist", "classification", 10_000, 784,
                          "MNIST test set (10k digits), 8k/2k split", _load_mnist,
                          REMOTE_FILES["mnist"], num_classes=10,
                          options=sizes("training digits", "test digits")),
    "cifar10": DatasetEntry("cifar10", "classification", 60_000, 3072,
                            "CIFAR-10, your copy of the binary batches (cifar-10-batches-bin)",
                            _load_cifar10, tuple(FileSpec(f"{CIFAR_FOLDER}/{name}", (), "")
                                                 for name in (*CIFAR_TRAIN, CIFAR_TEST)),
                            num_classes=10, options=sizes("training images", "test images"),
                            refused=REFUSED),
    **{entry.name: entry for entry in _GENERATED},
}
ALIASES: dict[str, str] = {"mixture": "gmm10"}


def search_path() -> list[Path]:
    """Data roots: the entries of ``$GPSCALE_DATA`` (``os.pathsep``-separated), then the cache."""
    entries = os.environ.get("GPSCALE_DATA", "").split(os.pathsep)
    return [*(Path(e).expanduser() for e in entries if e), default_cache_dir()]


def get_entry(name: str) -> DatasetEntry:
    """The registry entry of ``name`` (aliases resolved); ValueError lists the valid names."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DATASETS:
        names = sorted([*DATASETS, *ALIASES])
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(names)}")
    return DATASETS[key]


def _roots(roots: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if roots is None:
        return search_path()
    if isinstance(roots, (str, Path)):
        return [Path(roots).expanduser()]
    return [Path(r).expanduser() for r in roots]


def _find_folder(entry: DatasetEntry, roots: list[Path]) -> Path | None:
    for root in roots:
        if all((root / spec.path).is_file() for spec in entry.files):
            return root / entry.folder
    return None


def load_dataset(name: str, *, split: int = 0,
                 roots: str | Path | Sequence[str | Path] | None = None, seed: int = 0,
                 dtype: torch.dtype = torch.float64, **kwargs: Any) -> Dataset:
    """Load a registered data set.

    Args:
        name: a key of :data:`DATASETS` or an alias (case-insensitive).
        split: UCI: the mask column 0..9; MNIST and generated sets: added to ``seed``.
        roots: data roots to search instead of :func:`search_path`.
        seed: seed of the MNIST subset permutation and of generated data.
        dtype: floating dtype of x (and of y for regression and counts).
        **kwargs: loader options, e.g. ``num_train``/``num_test`` for MNIST, generator arguments
            for synthetic sets (``n`` is accepted for ``num_train``); each set declares its
            own (``DatasetEntry.options``).

    Returns:
        The :class:`Dataset`.

    Raises:
        ValueError: unknown name (lists the valid names), a bad split, or an unknown or
            invalid option (lists the valid ones).
        FileNotFoundError: the files are in none of the roots (names the folders searched).
    """
    entry = get_entry(name)
    if isinstance(split, bool) or not isinstance(split, int):
        raise ValueError(f"split must be an integer; got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    kwargs = check_data_options(entry.name, entry.options, kwargs)
    folder = None
    if entry.files:
        searched = _roots(roots)
        folder = _find_folder(entry, searched)
        if folder is None:
            for root in searched:
                for name, why in entry.refused.items():
                    if (root / name).exists():
                        raise FileNotFoundError(f"data set {entry.name!r}: {root / name} is "
                                                f"{why}")
            where = ", ".join(str(r / entry.folder) for r in searched)
            raise FileNotFoundError(
                f"data set {entry.name!r} not found; searched: {where}. Set GPSCALE_DATA to a "
                f"folder containing {entry.folder}/ or run `gpscale datasets download "
                f"{entry.name}`")
    return entry.loader(entry, folder, split=split, seed=seed, dtype=dtype, **kwargs)


def list_datasets(roots: str | Path | Sequence[str | Path] | None = None) -> list[DatasetInfo]:
    """Every registered data set with whether its files are present and where."""
    searched = _roots(roots)
    out = []
    for entry in DATASETS.values():
        folder = _find_folder(entry, searched) if entry.files else None
        location = "generated" if not entry.files else (str(folder) if folder else None)
        aliases = tuple(sorted(a for a, name in ALIASES.items() if name == entry.name))
        out.append(DatasetInfo(entry.name, entry.task, entry.n, entry.d,
                               present=location is not None, location=location,
                               description=entry.description, aliases=aliases))
    return out
