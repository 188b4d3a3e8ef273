"""Every ```python block of README.md and docs/*.md runs (the ```console blocks: test_docs_examples.py).

A block runs in a fresh namespace, in a temporary folder holding the checkout's ``examples/``, so the paths a page
shows (``examples/resnet50-v1.5.onnx``) are found and the files it writes land there. What the reader brings (their
model, their data loader) is made by a hidden comment just above the block, which the page does not show::

    <!-- example needs: torch
    net = torch.nn.Linear(4, 2)
    -->

Its first line names what the block needs: modules that must import, and ``cuda`` for a CUDA device; the lines
after it run before the block, in its namespace. A block that needs a framework skips where it is absent and, as
the console examples, runs only under CI (``CI`` set) or with ``FLOPCOUNT_DOCS_EXAMPLES=all``; a block that needs
nothing always runs. Every block is compiled, so none is left with text that is not Python.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
from typing import NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = re.compile(r"<!-- example(?: needs:(?P<needs>[^\n]*))?\n(?P<code>(?:(?!<!--).)*?)-->\s*$", re.DOTALL)


class Block(NamedTuple):
    line: int
    code: str
    needs: tuple[str, ...]
    setup: str


def python_blocks(text: str) -> list[Block]:
    """Each ```python block of ``text``: its first line's number, its code, and what the hidden comment just above
    it (if any) says it needs and sets up."""
    blocks, lines, start = [], text.splitlines(keepends=True), None
    for number, line in enumerate(lines, 1):
        fence = line.strip()
        if start is None and fence == "```python":
            start = number
        elif start is not None and fence.startswith("```"):
            before = "".join(lines[:start - 1])
            match = SETUP.search(before)
            needs = tuple(match["needs"].split()) if match and match["needs"] else ()
            blocks.append(Block(start, "".join(lines[start:number - 1]), needs, match["code"] if match else ""))
            start = None
    return blocks


def _collect():
    params = []
    for page in PAGES:
        for block in python_blocks(page.read_text(encoding="utf-8")):
            params.append(pytest.param(block, id=f"{page.relative_to(ROOT).as_posix()}:{block.line}"))
    return params


BLOCKS = _collect()


def test_parser_reads_blocks_and_their_setup():
    text = ("```python\na = 1\n```\ntext\n<!-- example needs: torch cuda\nnet = 2\n-->\n```python\nb = net\n```\n"
            "```sh\nc = 3\n```\n")
    assert python_blocks(text) == [Block(1, "a = 1\n", (), ""), Block(8, "b = net\n", ("torch", "cuda"), "net = 2\n")]


def test_the_pages_show_python_examples():
    assert any(p.id.startswith("README.md:") for p in BLOCKS)
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("block", BLOCKS)
def test_every_block_is_python(block):
    compile(block.setup, "setup", "exec")
    compile(block.code, "block", "exec")


def _missing(needs: tuple[str, ...]) -> list[str]:
    missing = [m for m in needs if m != "cuda" and importlib.util.find_spec(m) is None]
    if "cuda" in needs and not missing:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA device")
    return missing


@pytest.mark.parametrize("block", BLOCKS)
def test_docs_python_block_runs(block, tmp_path, monkeypatch):
    missing = _missing(block.needs)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    if block.needs and not (os.environ.get("CI") or os.environ.get("FLOPCOUNT_DOCS_EXAMPLES") == "all"):
        pytest.skip("a framework example: runs under CI or with FLOPCOUNT_DOCS_EXAMPLES=all")
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs_example__"}
    exec(compile(block.setup, "setup", "exec"), namespace)  # noqa: S102 - the page's own hidden setup
    exec(compile(block.code, "block", "exec"), namespace)  # noqa: S102 - the page's example
