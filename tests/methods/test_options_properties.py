"""Property-based: any ``-o KEY=VALUE`` text gives a typed value or a clear OptionError."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpscale.cli.__main__ import build_parser, main
from gpscale.methods import METHODS
from gpscale.methods.options import OptionError, coerce

OPTIONS = [(key, option) for key, spec in sorted(METHODS.items()) for option in spec.options]
TEXT = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"-?[0-9]{0,4}(\.[0-9]{0,3})?(e-?[0-9])?", fullmatch=True),
    st.sampled_from(["true", "False", "none", "null", "[1, 2]", "[[0, 0], [1, 1]]", "1,2",
                     "nan", "inf", "-1", "0", "[]", "[1, 'a']", "{}", "1e400"]))


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(OPTIONS) - 1), text=TEXT)
def test_any_text_is_typed_or_a_clear_error(index, text):
    key, option = OPTIONS[index]
    try:
        value = coerce(option, text)
    except OptionError as err:
        message = str(err)
        assert message.startswith(f"option {option.name}=") and "default" in message
        return
    if value is None:
        assert option.nullable
    elif option.kind == "int":
        assert type(value) is int
    elif option.kind == "float":
        assert type(value) is float
    elif option.kind == "bool":
        assert type(value) is bool
    elif option.kind == "str":
        assert option.choices is None or value in option.choices
    assert coerce(option, value) == value  # a typed value passes its own check unchanged


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=20))
def test_cli_option_parsing_never_tracebacks(text):
    """Through the CLI: exit 2 with one line (an argparse usage error or ours), never a
    traceback; fitting never starts because every such option is bad for ``exact``."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            rc = main(["fit", "--dataset", "elevators", "--method", "exact",
                       "-o", f"bogus{text}=1"])
        except SystemExit as exit_:  # argparse rejects the flag itself
            rc = exit_.code
    err = stderr.getvalue()
    assert rc == 2 and "Traceback" not in err


def test_parser_keeps_option_values_as_text():
    args = build_parser().parse_args(["fit", "--dataset", "x", "--method", "svgp",
                                      "-o", "num_inducing=32", "-o", "ard=False"])
    assert args.option == [("num_inducing", "32"), ("ard", "False")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fit", "--dataset", "x", "--method", "svgp", "-o", "=3"])
