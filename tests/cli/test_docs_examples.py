"""Every command in a ```console block of README.md and docs/*.md runs, and exits as the page says.

A page marks a runnable example as a ```console block whose ``$ flopcount ...`` lines run from a checkout's root
(output lines below them are not compared); a trailing ``# exit N`` gives the expected exit code (default 0). A
block that also runs other commands (a ``$ python`` line writing the model) is a session shown, not run.
Examples that need no GPU and no network go there; the rest are ```sh blocks, shown but not run.

Each command runs in this process through :func:`flopcount.cli.main` (what the ``flopcount`` script calls), in a
temporary folder holding the checkout's ``examples/``, so files it writes with ``-o`` land there. Examples that
need a framework (``--torch``, ``--hf``, ``--keras``, ``bench``, ``profile``) skip where it is absent and, since an
export takes seconds to minutes on a loaded machine, run only under CI (``CI`` set) or with
``FLOPCOUNT_DOCS_EXAMPLES=all``; the ONNX examples always run.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")

#: what an example needs, by a word of its command line → the modules that must import
NEEDS = {
    "--torch": ("torch", "onnxscript"),
    "--hf": ("torch", "onnxscript", "transformers"),
    "--keras": ("tensorflow", "tf2onnx"),
    "bench": ("torch", "sklearn"),
    "profile": ("onnxruntime",),
    "ceilings": ("torch",),
    "--plot": ("matplotlib",),
}


def console_examples(text: str) -> list[tuple[int, str, int]]:
    """``(line number, command, expected exit)`` of each ``$ flopcount`` line inside a ```console block of
    ``text``. A block that also runs other commands (``$ python -c ...`` making the model the next line counts) is
    a session shown, not run: its lines are left out."""
    examples, block, inside = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        fence = line.strip()
        if fence.startswith("```"):
            if inside and all(command.startswith("flopcount") for _, command, _ in block):
                examples.extend(block)
            inside, block = not inside and fence == "```console", []
            continue
        if inside and line.startswith("$ "):
            command, expected = line[2:].strip(), 0
            match = EXIT.search(command)
            if match:
                command, expected = command[: match.start()], int(match.group(1))
            block.append((number, command, expected))
    return examples


def _collect():
    params = []
    for page in PAGES:
        for number, command, expected in console_examples(page.read_text(encoding="utf-8")):
            rel = page.relative_to(ROOT).as_posix()
            params.append(pytest.param(command, expected, id=f"{rel}:{number}"))
    return params


EXAMPLES = _collect()


def test_parser_reads_blocks_commands_and_exits():
    text = "```sh\n$ flopcount not-run.onnx\n```\n```console\n$ flopcount a.onnx\nsome output\n" \
           "$ flopcount b.onnx --strict  # exit 6\n```\n$ flopcount outside.onnx\n" \
           "```console\n$ python make.py\n$ flopcount made.onnx\n```\n"
    assert console_examples(text) == [(5, "flopcount a.onnx", 0), (7, "flopcount b.onnx --strict", 6)]


def test_the_pages_show_examples():
    readme = [p for p in EXAMPLES if p.id.startswith("README.md:")]
    assert len(readme) == 10, "README.md shows ten example commands in its ```console block"
    assert len(EXAMPLES) > len(readme)


def _pages_in(entry) -> set[str]:
    if isinstance(entry, str):
        return {entry}
    if isinstance(entry, list):
        return set().union(*(_pages_in(e) for e in entry)) if entry else set()
    if isinstance(entry, dict):
        return set().union(*(_pages_in(v) for v in entry.values())) if entry else set()
    return set()


def test_every_page_is_in_the_site_navigation():
    # Parsed as YAML, as mkdocs reads it: a page title holding ": " unquoted is a YAML error that stops the site.
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _pages_in(config["nav"])
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - nav == set(), "add each docs/*.md page to nav: in mkdocs.yml"
    assert nav - pages == set(), "mkdocs.yml names a page that docs/ does not have"


@pytest.mark.parametrize("front", ["README.md", "docs/index.md"])
def test_the_front_doors_link_every_page(front):
    # a new user finds every page of the site from the README and from the site's first page
    yaml = pytest.importorskip("yaml")
    nav = _pages_in(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]) - {"index.md"}
    text = (ROOT / front).read_text(encoding="utf-8")
    prefix = "docs/" if front == "README.md" else ""
    linked = set(re.findall(rf"\]\({re.escape(prefix)}([\w.-]+\.md)[)#]", text))
    assert nav - linked == set(), f"{front} does not link {sorted(nav - linked)}"


def _missing(argv: list[str]) -> list[str]:
    needed = {m for word in argv for m in NEEDS.get(word, ())}
    return sorted(m for m in needed if importlib.util.find_spec(m) is None)


@pytest.mark.parametrize("command, expected", EXAMPLES)
def test_docs_example_exits_as_the_page_says(command, expected, tmp_path, monkeypatch, capsys):
    from flopcount.cli import main

    argv = shlex.split(command)
    assert argv[0] == "flopcount", f"a ```console example runs flopcount: {command}"
    missing = _missing(argv[1:])
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    heavy = any(word in NEEDS for word in argv[1:])
    if heavy and not (os.environ.get("CI") or os.environ.get("FLOPCOUNT_DOCS_EXAMPLES") == "all"):
        pytest.skip("a framework example (an export): runs under CI or with FLOPCOUNT_DOCS_EXAMPLES=all")
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    code = main(argv[1:])
    out, err = capsys.readouterr()
    assert code == expected, f"{command!r} exited {code}, the page says {expected}; stderr: {err[-2000:]}"
    if expected:
        assert err.strip() and "Traceback" not in err, "a refusal is one line on stderr, never a traceback"
    else:
        assert out.strip() or any(tmp_path.iterdir()), "a successful example prints or writes its report"


def test_the_files_the_pages_name_exist():
    # `tests/acceptance/test_resnet50.py`, `benchmarks/count_speed.py` ...: a moved file leaves no stale name
    rooms = "tests|benchmarks|flopcount|frontends|models|operators|examples"
    named = re.compile(rf"`((?:{rooms})/[\w/.-]+\.(?:py|onnx|json))`")
    missing = {f"{page.relative_to(ROOT).as_posix()}: {path}" for page in PAGES
               for path in named.findall(page.read_text(encoding="utf-8")) if not (ROOT / path).exists()}
    assert not missing, sorted(missing)
