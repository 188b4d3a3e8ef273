"""The examples in the core's docstrings run."""

import doctest

import pytest

import flopcount.context
import flopcount.cost
import flopcount.counting
import flopcount.errors
import flopcount.output.files
import flopcount.parallel.ranks
import flopcount.pipeline.progress
import flopcount.output.render
import flopcount.version


@pytest.mark.parametrize("module", [flopcount.cost, flopcount.context, flopcount.counting, flopcount.errors,
                                    flopcount.output.files, flopcount.parallel.ranks, flopcount.output.render, flopcount.pipeline.progress,
                                    flopcount.version],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
