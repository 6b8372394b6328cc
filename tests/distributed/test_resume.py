"""A data-parallel run resumes a checkpoint only on the data and settings it was written for,
and says that it resumed, as one process does (``training.checkpoint``)."""

from __future__ import annotations

import logging

import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.distributed import launch
from gpscale.training import FitConfig, fit

from . import _jobs

N = 41  # uneven shards: 21 + 20 rows


def test_two_ranks_resume_only_on_the_data_of_the_checkpoint(tmp_path, capfd, caplog):
    """A one-process checkpoint: 2 ranks refuse other data of the same shape (their shards'
    probe rows are gathered, the rows one process probes) and resume on its own data; rank 0
    alone logs the "resumed" line."""
    ckpt = tmp_path / "c.pt"
    x, y, _ = _jobs.data(N)
    config = FitConfig(lr=0.05, epochs=2, progress=False, checkpoint=str(ckpt))
    fit(_jobs.svgp_model(x, y), None, (x, y), config)
    caplog.set_level(logging.INFO, logger="gpscale.fit")  # as gpscale fit sets it
    capfd.readouterr()
    ranks = launch(_jobs.resume_job, (str(ckpt), N), nproc=2, timeout=60)
    for rank in ranks:
        assert "other training data of the same shape" in rank["other"]
        assert rank["other"].startswith(f"{ckpt}: ")
        assert rank["same"] == [1, 2, 3, 4]
    err = capfd.readouterr().err
    assert err.count(f"resumed at epoch 3 from {ckpt} (2 epochs") == 1, err


def _write_csv(path, seed: int) -> str:
    x, y, _ = _jobs.data(N, seed=seed)
    rows = torch.column_stack([x, y]).tolist()
    path.write_text("a,b,y\n" + "".join(",".join(f"{v:.17g}" for v in row) + "\n"
                                         for row in rows))
    return str(path)


@pytest.mark.slow
def test_cli_fit_nproc_2_refuses_a_checkpoint_of_other_data(tmp_path, capfd):
    """``gpscale fit --nproc 2 --checkpoint C`` on another file of the same shape: one error
    line, exit 2; on the same file with more epochs: resumed, and it says so."""
    ckpt = str(tmp_path / "c.pt")

    def argv(data: str, out: str, epochs: int) -> list[str]:
        return ["fit", "--data", data, "--target", "y", "--method", "svgp", "-o",
                "num_inducing=8", "--epochs", str(epochs), "--nproc", "2", "--no-progress",
                "--checkpoint", ckpt, "--out", str(tmp_path / out)]

    first, other = _write_csv(tmp_path / "a.csv", 0), _write_csv(tmp_path / "b.csv", 1)
    assert main(argv(first, "a", 2)) == 0
    capfd.readouterr()
    assert main(argv(other, "b", 4)) == 2
    lines = [line for line in capfd.readouterr().err.splitlines()
             if line.startswith("gpscale fit: ")]
    assert len(lines) == 1 and "other training data of the same shape" in lines[0], lines
    assert main(argv(first, "c", 4)) == 0
    assert capfd.readouterr().err.count(f"resumed at epoch 3 from {ckpt}") == 1
