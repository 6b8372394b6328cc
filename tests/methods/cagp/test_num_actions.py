"""CaGP-Opt's default number of actions, and the options a method sizes by its training rows
(``MethodSpec.row_sized``), which ``auto``'s race fixes at the whole data's n."""

from __future__ import annotations

import pytest

from gpscale.methods import build
from gpscale.methods.cagp.pipeline import (
    LARGE_NUM_ACTIONS,
    LARGE_ROWS,
    NUM_ACTIONS_CAP,
    default_num_actions,
)
from gpscale.methods.registry import MethodSpec, get_spec


@pytest.mark.parametrize("n, want", [(1, 1), (3, 1), (10, 5), (1_023, 511), (1_024, 512),
                                     (LARGE_ROWS - 1, 512), (LARGE_ROWS, 1_024),
                                     (500_000, 1_024)])
def test_default_number_of_actions_follows_n(n, want):
    assert default_num_actions(n) == want
    assert NUM_ACTIONS_CAP == 512 and LARGE_NUM_ACTIONS == 1_024


@pytest.mark.parametrize("n", [LARGE_ROWS - 1, LARGE_ROWS])
def test_the_factory_builds_the_default_and_keeps_a_given_number(n):
    """Rebuilt without data (``num_train``), the policy has the default's blocks, every row in
    one of them; a number given is kept at any n."""
    model = build("cagp-opt", 2, num_train=n)
    assert model.policy.layout.num_blocks == default_num_actions(n) == model.options["num_actions"]
    assert sum(model.policy.layout.sizes()) == n
    assert build("cagp-opt", 2, num_train=n, num_actions=64).policy.layout.num_blocks == 64


def test_sized_for_rows_fills_only_what_the_user_left_open():
    spec = get_spec("cagp-opt")
    assert spec.sized_for_rows({}, 40_000) == {"num_actions": 1_024}
    assert spec.sized_for_rows({"num_actions": None, "seed": 3}, 2_000) == {
        "num_actions": 512, "seed": 3}
    assert spec.sized_for_rows({"num_actions": 64}, 40_000) == {"num_actions": 64}
    options = {"num_inducing": 128}
    assert get_spec("svgp").sized_for_rows(options, 40_000) == options  # declares none


def test_a_spec_sizing_an_undeclared_option_by_rows_is_refused():
    spec = get_spec("cagp-opt")
    with pytest.raises(ValueError, match=r"sizes undeclared options by rows: \['num_blocks'\]"):
        MethodSpec(key="mine", factory=spec.factory, tasks=("regression",), summary="mine",
                   options=spec.options, row_sized={"num_blocks": default_num_actions})
