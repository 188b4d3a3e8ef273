"""flopcount.errors: the exception hierarchy's exit codes and the first line of an exception."""

from __future__ import annotations

import pytest

from flopcount import errors
from flopcount.errors import first_line


@pytest.mark.parametrize(
    "exc, expected",
    [
        pytest.param(ValueError("bad shape\nTraceback: ..."), "bad shape", id="first-of-several"),
        pytest.param(RuntimeError("\n\n   after blanks  \nmore"), "after blanks", id="leading-blank-lines"),
        pytest.param(KeyError(), "KeyError", id="no-message"),
        pytest.param(ValueError("   \n  "), "ValueError", id="only-blanks"),
        pytest.param(OSError("\x1b[31mred\x1b[0m text"), "red text", id="colour-codes"),
        pytest.param(ValueError("a \t  b"), "a b", id="white-space-folded"),
    ],
)
def test_first_line(exc, expected):
    assert first_line(exc) == expected


def test_first_line_is_cut_to_the_limit():
    text = first_line(ValueError("x" * 500))
    assert len(text) == 300 and text.endswith("...")  # 297 characters and the ellipsis
    assert first_line(ValueError("x" * 20), limit=10) == "x" * 7 + "..."


def test_each_error_class_has_its_own_exit_code():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.FlopcountError)]
    codes = [c.exit_code for c in classes if c is not errors.FlopcountError]
    assert len(codes) == len(set(codes))
