"""Input validation: each bad input gets a ValueError that names the problem."""

from __future__ import annotations

import pytest
import torch

from gpscale.validation import check_class_labels, check_num_points, check_x, check_xy


@pytest.mark.parametrize("x, y, task, match", [
    (torch.tensor([[0.0], [float("nan")]]), torch.zeros(2), "regression", "NaN or inf"),
    (torch.zeros(3, 1), torch.tensor([0.0, float("inf"), 1.0]), "regression", "y contains"),
    (torch.zeros(3, 1), torch.zeros(2), "regression", "same length"),
    (torch.zeros(3), torch.zeros(3), "regression", "2-D"),
    (torch.zeros(3, 1), torch.tensor([0.0, 1.0, 1.5]), "classification", "integers"),
    (torch.zeros(2, 1), torch.tensor([-1.0, 0.0]), "counts", "non-negative"),
    (torch.zeros(2, 1), torch.tensor([1.0, 2.5]), "counts", "integers"),
], ids=["nan-x", "inf-y", "length", "1-d", "label-float", "negative-count", "fractional-count"])
def test_bad_input_names_the_problem(x, y, task, match):
    with pytest.raises(ValueError, match=match):
        check_xy(x, y, task=task)


def test_labels_outside_range():
    with pytest.raises(ValueError, match=r"0\.\.2 for 3 classes; found label 3"):
        check_xy(torch.zeros(2, 1), torch.tensor([0, 3]), task="classification", num_classes=3)


def test_wrong_feature_count_at_predict_time():
    with pytest.raises(ValueError, match="has 3 features, but the model was fitted with 2"):
        check_x(torch.zeros(4, 3), num_dims=2)


def test_fewer_points_than_inducing_points():
    with pytest.raises(ValueError, match="10 training points are fewer than the 20 inducing"):
        check_num_points(10, 20, "inducing points")


def test_valid_input_passes_unchanged():
    x, y = torch.randn(5, 2), torch.tensor([0, 1, 1, 0, 2])
    out_x, out_y = check_xy(x, y, task="classification", num_classes=3)
    assert out_x is x and out_y is y


@pytest.mark.parametrize("classes, rows, match", [
    (["0", "0.25", "1"], 40, r"numbers with a fractional part \(0.25\)"),
    ([0.0, 0.5, 1.5, 2.5, 3.5], 40, r"\(0.5, 1.5, 2.5, ...\)"),
    ([str(i) for i in range(21)], 40, "21 distinct values in 40 rows"),
], ids=["text", "floats", "identifier"])
def test_a_target_that_is_not_class_labels_is_refused(classes, rows, match):
    with pytest.raises(ValueError, match=match):
        check_class_labels(classes, rows, name="y")


@pytest.mark.parametrize("classes", [["0", "1", "2"], [0.0, 1.0, 2.0], ["cat", "dog"],
                                     ["a", "0.5"], [str(i) for i in range(20)]],
                         ids=["integer-text", "integer-floats", "text", "mixed", "half-the-rows"])
def test_class_labels_pass(classes):
    """Integers, text (a number among text labels is text too) and up to one class per two
    rows are labels."""
    check_class_labels(classes, 40)
