"""The examples in the docstrings of the memory ledger's modules run."""

import doctest

import pytest

import flopcount.memory.kernels
import flopcount.memory.ledger
import flopcount.memory.ranks
import flopcount.parallel.plan
import flopcount.saved


@pytest.mark.parametrize("module", [flopcount.memory.kernels, flopcount.memory.ledger, flopcount.memory.ranks, flopcount.parallel.plan, flopcount.saved],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
