"""The examples in the core's docstrings run."""

import doctest

import pytest

import flopcount.context
import flopcount.cost
import flopcount.counting
import flopcount.errors
import flopcount.files
import flopcount.parallel
import flopcount.progress
import flopcount.render
import flopcount.version


@pytest.mark.parametrize("module", [flopcount.cost, flopcount.context, flopcount.counting, flopcount.errors,
                                    flopcount.files, flopcount.parallel, flopcount.render, flopcount.progress,
                                    flopcount.version],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
