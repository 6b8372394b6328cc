"""download(): file:// URLs, SHA-256 verification, atomic writes, registry digests."""

from __future__ import annotations

import gzip
import hashlib
import shutil

import pytest

from gpscale.data.datasets import load_dataset
from gpscale.data.download import REMOTE_FILES, FileSpec, download, fetch_file, file_digest


def _files_under(folder):
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_fetch_file_success_and_digest(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"gaussian processes\n")
    digest = hashlib.sha256(b"gaussian processes\n").hexdigest()
    spec = FileSpec("x/src.bin", (src.as_uri(),), digest)
    dest = fetch_file(src.as_uri(), tmp_path / "cache" / "x" / "src.bin", spec)
    assert dest.read_bytes() == b"gaussian processes\n"
    assert file_digest(dest) == digest


def test_fetch_file_mismatch_leaves_nothing(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"tampered")
    spec = FileSpec("x/src.bin", (src.as_uri(),), "0" * 64)
    with pytest.raises(ValueError) as err:
        fetch_file(src.as_uri(), tmp_path / "cache" / "x" / "src.bin", spec)
    message = str(err.value)
    assert "x/src.bin" in message and "0" * 64 in message
    assert hashlib.sha256(b"tampered").hexdigest() in message
    assert not (tmp_path / "cache").exists()


def test_gunzip_digest_ignores_gzip_header(tmp_path):
    """The same payload compressed with different time stamps has one payload digest."""
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    a.write_bytes(gzip.compress(b"idx payload", mtime=0))
    b.write_bytes(gzip.compress(b"idx payload", mtime=123456))
    assert file_digest(a) != file_digest(b)
    expected = hashlib.sha256(b"idx payload").hexdigest()
    assert file_digest(a, digest_of="gunzip") == file_digest(b, digest_of="gunzip") == expected


def test_unknown_name_lists_downloadable():
    with pytest.raises(ValueError, match="downloadable data sets: .*mnist.*yacht"):
        download("binary1d")


def test_registry_urls_point_at_public_sources():
    assert set(REMOTE_FILES) == {"airfoil", "bike", "concrete", "elevators", "energy",
                                 "housing", "keggundirected", "kin40k", "parkinsons", "protein",
                                 "skillcraft", "wine", "yacht", "mnist"}
    for name, specs in REMOTE_FILES.items():
        for spec in specs:
            assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
            assert all(url.startswith("https://") and url.endswith(spec.filename)
                       for url in spec.urls)
            if name != "mnist":
                assert all("treforevans/uci_datasets/" in url and
                           f"uci_datasets/{name}/{spec.filename}" in url for url in spec.urls)


def test_registry_digests_match_shared_files(data_root):
    for specs in REMOTE_FILES.values():
        for spec in specs:
            assert file_digest(data_root / spec.path, digest_of=spec.digest_of) == spec.sha256


@pytest.fixture
def mirror(tmp_path, data_root):
    """A local copy of the yacht files served through file:// URLs."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    for name in ("data.csv.gz", "test_mask.csv.gz"):
        shutil.copy(data_root / "uci" / "yacht" / name, folder / name)
    return folder


def test_download_with_file_urls(tmp_path, mirror, data_root):
    cache = tmp_path / "cache"
    folder = download("yacht", cache_dir=cache, urls=mirror.as_uri())
    assert folder == cache / "uci" / "yacht"
    for name in ("data.csv.gz", "test_mask.csv.gz"):
        assert (folder / name).read_bytes() == (data_root / "uci" / "yacht" / name).read_bytes()
    assert load_dataset("yacht", roots=[cache]).num_dims == 6
    # a verified copy is kept: no URL is read when the files are present
    assert download("yacht", cache_dir=cache, urls=(tmp_path / "gone").as_uri()) == folder
    with pytest.raises(OSError, match="could not download uci/yacht/data.csv.gz; tried: file:"):
        download("yacht", cache_dir=cache, urls=(tmp_path / "gone").as_uri(), force=True)
    assert _files_under(cache) == [folder / "data.csv.gz", folder / "test_mask.csv.gz"]


def test_download_mapping_urls_and_checksum_mismatch(tmp_path, mirror):
    with (mirror / "data.csv.gz").open("ab") as f:
        f.write(b"\0")
    actual = file_digest(mirror / "data.csv.gz")
    urls = {name: (mirror / name).as_uri() for name in ("data.csv.gz", "test_mask.csv.gz")}
    cache = tmp_path / "cache"
    with pytest.raises(ValueError) as err:
        download("yacht", cache_dir=cache, urls=urls)
    message = str(err.value)
    assert "uci/yacht/data.csv.gz" in message and actual in message
    assert REMOTE_FILES["yacht"][0].sha256 in message
    assert _files_under(cache) == []
