"""gpscale.data: data sets, splits, standardisation, synthetic generators and downloads.

Example:
    >>> from gpscale.data import load_dataset
    >>> data = load_dataset("synthetic")
    >>> data.x_train.shape, data.task
    (torch.Size([3000, 1]), 'regression')
"""

from gpscale.data.csv import load_csv, load_table
from gpscale.data.datasets import (
    ALIASES,
    DATASETS,
    TASKS,
    Dataset,
    DatasetEntry,
    DatasetInfo,
    get_entry,
    list_datasets,
    load_dataset,
    search_path,
    standardized_dataset,
)
from gpscale.data.download import REMOTE_FILES, FileSpec, default_cache_dir, download
from gpscale.data.mnist import read_idx
from gpscale.data.splits import random_split, read_mask, uci_split
from gpscale.data.synthetic import (
    FieldStream,
    MixtureComponents,
    SyntheticData,
    binary_classification,
    demo_regression,
    field_dataset,
    gaussian_mixture,
    mixture_components,
    noisy_sine,
    poisson_counts,
    rbf_prior_sample,
    stream_field,
)
from gpscale.data.transforms import Standardizer

__all__ = [
    "ALIASES",
    "DATASETS",
    "REMOTE_FILES",
    "TASKS",
    "Dataset",
    "DatasetEntry",
    "DatasetInfo",
    "FieldStream",
    "FileSpec",
    "MixtureComponents",
    "Standardizer",
    "SyntheticData",
    "binary_classification",
    "default_cache_dir",
    "demo_regression",
    "download",
    "field_dataset",
    "gaussian_mixture",
    "get_entry",
    "list_datasets",
    "load_csv",
    "load_dataset",
    "load_table",
    "mixture_components",
    "noisy_sine",
    "poisson_counts",
    "random_split",
    "rbf_prior_sample",
    "read_idx",
    "read_mask",
    "search_path",
    "standardized_dataset",
    "stream_field",
    "uci_split",
]
