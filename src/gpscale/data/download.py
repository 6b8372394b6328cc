"""Fetch the public original data files into the cache, verifying SHA-256 digests.

This is the only module that touches the network, and only when :func:`download` is called
(``gpscale datasets download NAME``). Files land in ``<cache>/uci/<name>/`` or ``<cache>/mnist/``,
the layout that :func:`gpscale.data.datasets.load_dataset` searches.

Sources:

- UCI: the ``uci_datasets`` collection, github.com/treforevans/uci_datasets, files
  ``uci_datasets/<name>/data.csv.gz`` and ``test_mask.csv.gz`` (stored with Git LFS, so they are
  fetched from ``media.githubusercontent.com``, with GitHub's ``/raw/`` link as a second URL).
  The digests are those of the files in the shared development data, which are these originals.
- MNIST test set: the mirrors used by torchvision (``ossci-datasets``) and TensorFlow
  (``cvdf-datasets``). The archives there are gzip streams of the original IDX files, but the
  archive bytes vary between mirrors (the gzip header stores a time stamp), so for MNIST the digest
  is that of the *decompressed* IDX payload (``digest_of="gunzip"``). Those payloads have the
  widely published MD5s 2646ac64… (images) and 27ae3e4e… (labels).

Each file is written to a temporary file next to its destination and renamed into place only
after its digest matched, so a failed or interrupted download leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FileSpec", "REMOTE_FILES", "default_cache_dir", "file_digest", "fetch_file",
           "download"]

logger = logging.getLogger(__name__)

_UCI_URLS = (
    "https://media.githubusercontent.com/media/treforevans/uci_datasets/master/"
    "uci_datasets/{name}/{file}",
    "https://github.com/treforevans/uci_datasets/raw/master/uci_datasets/{name}/{file}",
)
_MNIST_URLS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/{file}",
    "https://storage.googleapis.com/cvdf-datasets/mnist/{file}",
)
# name -> (sha256 of data.csv.gz, sha256 of test_mask.csv.gz)
_UCI_DIGESTS = {
    "airfoil": ("1cce82516ac9e564fba52f55d817eb147fc39085f5d7b958ad15b92f4207f23e",
                "dbba6121fb8f900350fe10d724b54faa2b67fcc7bfc3409cf7add717281609e4"),
    "bike": ("411f76ae426c0e348a2629dcf6b3b29102c7db465eae780a3454c39db1dfac4f",
             "cf13dc25e80c03019cf2b01666f9cc29b03ea222f5c519536023ea56669bf337"),
    "concrete": ("542c5d9a0d301bdb47550280398dcbbe2fb8404631fc945de1ea6df9ade741c6",
                 "fae0926c655e4f9fb5669d0dbf2226bd8ff7daaadbd376adb8f32eac6f752e7e"),
    "elevators": ("e39bc18a80ec3611e4fd76d0f86ee377e96ba21b568b9997576d538dafe56b7b",
                  "9fe662eacca95ae2c9301cbc4c4134e55d58e903cb0cfb683771ffdd2d248eb5"),
    "energy": ("431b6df04243db782bbcd45e408373a654334496ebe5d9c9985ab2e826a39f51",
               "217df2cd4cabf818390e26a65384ea113c95b75bd687787a37ed2f87f28c9bb8"),
    "housing": ("9f5b8a1cbc051465dcf10f4298aaccd8a596ea68de0db693159be6e7d07ccf12",
                "4c114b259566dd04b92befc3f22709d77fe1d5a9048cebe2452c50d57056c1ac"),
    "keggundirected": ("117419270e50f581df18bf996ffc8b6bf1bb76c9f3640331ac9d6e64cff63d4e",
                       "ea56968ffbf638720943f2758fe0464e1ff532654bc5a67c369a1cda8c6e7f13"),
    "kin40k": ("9bee7f2a9f39aa61a015f239378368601fb3978c5bb9a96433e88a55d40883ba",
               "d15fd645d0e81a9a17ce2d0b8dde470bb2efba4d5f417459965abe4b237e2aea"),
    "parkinsons": ("d20ffd9c9e5053a03fff0b770e7b0e076bf856a34538198303c897b6cc6addde",
                   "090794e6acb34ce9134ce2ac530b60c408adc646e45f9296adf0e3eb134f1a64"),
    "protein": ("f709d0107c3ee90ab019b9e5d77fc2ae182158958cb70b1903236a51334fd01b",
                "22afe05e8d17c428558d78a77efeecc08d58004b6c95741d1c533c3207c69fe9"),
    "skillcraft": ("41233f5ea6bf596b04aa64f5eaf9bf4489ddeec53524fe2cc46d75bc7d480c0e",
                   "d97279b0da7415b80b3a0e8b6acb552bc7f974dc42f142a23a74f645b414736e"),
    "wine": ("e2ca3346651ddb43fbc6a1355e70e74b7ce68f93059e04405e9cb749c219eae2",
             "df80c2a700eafb42230991dd7a94c08d47baea55dde125a0a0dcae08964d4559"),
    "yacht": ("88ec8ea1a979ab0628a54392822c60b3699ea22541e912e83246f7d49f5adad1",
              "2f6d6b091146887589db66073317b8485e853d27e664b99b8b402ad57ba4a936"),
}
# file -> sha256 of the decompressed IDX payload
_MNIST_DIGESTS = {
    "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}


@dataclass(frozen=True)
class FileSpec:
    """One remote file of a data set.

    Attributes:
        path: destination relative to the cache root, POSIX style (``"uci/yacht/data.csv.gz"``).
        urls: public URLs, tried in order.
        sha256: expected hex digest.
        digest_of: ``"file"`` (digest of the bytes as downloaded) or ``"gunzip"`` (digest of the
            decompressed content of a gzip file).
    """

    path: str
    urls: tuple[str, ...]
    sha256: str
    digest_of: str = "file"

    def __post_init__(self) -> None:
        if self.digest_of not in ("file", "gunzip"):
            raise ValueError(f"digest_of must be 'file' or 'gunzip'; got {self.digest_of!r}")

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _uci_files(name: str) -> tuple[FileSpec, ...]:
    files = ("data.csv.gz", "test_mask.csv.gz")
    return tuple(
        FileSpec(f"uci/{name}/{file}", tuple(u.format(name=name, file=file) for u in _UCI_URLS),
                 digest)
        for file, digest in zip(files, _UCI_DIGESTS[name], strict=True))


REMOTE_FILES: dict[str, tuple[FileSpec, ...]] = {name: _uci_files(name) for name in _UCI_DIGESTS}
REMOTE_FILES["mnist"] = tuple(
    FileSpec(f"mnist/{file}", tuple(u.format(file=file) for u in _MNIST_URLS), digest, "gunzip")
    for file, digest in _MNIST_DIGESTS.items())


def default_cache_dir() -> Path:
    """``~/.cache/gpscale``, where downloads go and the last entry of the data search path."""
    return Path.home() / ".cache" / "gpscale"


def file_digest(path: str | Path, *, digest_of: str = "file") -> str:
    """SHA-256 hex digest of a file, or of its decompressed content (``digest_of="gunzip"``)."""
    opener = gzip.open if digest_of == "gunzip" else open
    sha = hashlib.sha256()
    with opener(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def fetch_file(url: str, dest: str | Path, spec: FileSpec, *, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` atomically, after checking the digest ``spec`` requires.

    Raises:
        ValueError: the digest does not match (the message names the file, the expected and the
            actual digest); nothing is written.
        OSError: the URL could not be read (``urllib.error.URLError`` is an ``OSError``).
    """
    dest = Path(dest)
    created = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as src:
            shutil.copyfileobj(src, out, length=1 << 20)
        actual = file_digest(tmp, digest_of=spec.digest_of)
        if actual != spec.sha256:
            raise ValueError(f"sha256 mismatch for {spec.path} downloaded from {url}: expected "
                             f"{spec.sha256}, got {actual}; the file was not saved")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in created:  # deepest first; only the folders this call created, if empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return dest


def _candidate_urls(spec: FileSpec, urls: Mapping[str, str | Sequence[str]] | str | None
                    ) -> tuple[str, ...]:
    if urls is None:
        return spec.urls
    if isinstance(urls, str):
        return (urls.rstrip("/") + "/" + spec.filename,)
    if spec.filename not in urls:
        raise ValueError(f"urls has no entry for {spec.filename!r}; keys: {', '.join(urls)}")
    chosen = urls[spec.filename]
    return (chosen,) if isinstance(chosen, str) else tuple(chosen)


def download(name: str, *, cache_dir: str | Path | None = None,
             urls: Mapping[str, str | Sequence[str]] | str | None = None,
             force: bool = False, timeout: float = 60.0) -> Path:
    """Fetch every file of a data set into the cache and verify it.

    Args:
        name: a downloadable data set (a key of ``REMOTE_FILES``: the UCI sets and ``"mnist"``).
        cache_dir: cache root; default ``~/.cache/gpscale``.
        urls: override the registered URLs: a base URL (file names are appended, e.g. a local
            mirror ``file:///srv/mirror/yacht``), or a mapping from file name
            (``"data.csv.gz"``) to one URL or a list of URLs tried in order.
        force: download even when a verified copy is already present.
        timeout: seconds per connection attempt.

    Returns:
        The folder that holds the files (``<cache>/uci/<name>`` or ``<cache>/mnist``).

    Raises:
        ValueError: unknown name (the message lists the downloadable ones) or a digest mismatch.
        OSError: no URL of a file could be read (the message lists each URL and its error).
    """
    if name not in REMOTE_FILES:
        own = (" (CIFAR-10 is read from your copy of the binary batches: put its "
               "cifar-10-batches-bin folder in a folder on GPSCALE_DATA)"
               if name == "cifar10" else "")
        raise ValueError(f"no downloadable files for {name!r}{own}; downloadable data sets: "
                         f"{', '.join(sorted(REMOTE_FILES))}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    for spec in REMOTE_FILES[name]:
        dest = root / spec.path
        if dest.exists() and not force:
            if file_digest(dest, digest_of=spec.digest_of) == spec.sha256:
                logger.info("%s: verified copy present at %s", spec.path, dest)
                continue
            logger.warning("%s: digest of the cached copy does not match; downloading again",
                           spec.path)
        errors = []
        for url in _candidate_urls(spec, urls):
            try:
                logger.info("downloading %s from %s", spec.path, url)
                fetch_file(url, dest, spec, timeout=timeout)
                break
            except (urllib.error.URLError, OSError) as err:
                errors.append(f"{url} ({err})")
        else:
            raise OSError(f"could not download {spec.path}; tried: {'; '.join(errors)}")
    return (root / REMOTE_FILES[name][0].path).parent
