"""The examples in the docstrings of the memory ledger's modules run."""

import doctest

import pytest

import flopcount.memory
import flopcount.memory_parallel
import flopcount.plan
import flopcount.saved


@pytest.mark.parametrize("module", [flopcount.memory, flopcount.memory_parallel, flopcount.plan, flopcount.saved],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
