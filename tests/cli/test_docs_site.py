"""The docs site's front door: the API page documents every name ``import flopcount`` offers (and says which it
documents from their modules), its docstrings render in the style mkdocstrings is set to, and wide tables fit or
wrap. The site is built (strictly, as CI builds it) where mkdocs and its plugins are installed."""

from __future__ import annotations

import html
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

import flopcount

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
ERRORS = {"ConfigError", "FlopcountError", "FrontendError", "InvalidGraphError", "ModelFileError", "OpsetError",
          "ShapeError", "UnsupportedOperatorError", "UsageError"}


def _documented(text: str) -> dict[str, str]:
    """Documented object → the module mkdocstrings reads it from, for each ``::: module.name`` of ``text``."""
    return {m[2]: m[1] for m in re.finditer(r"^::: ([\w.]+)\.(\w+)\s*$", text, re.MULTILINE)}


def test_the_api_page_documents_every_exported_name_where_it_lives():
    offered, rest = API.split("## From their modules")
    documented = _documented(offered)
    lazy = flopcount._LAZY
    for name in set(flopcount.__all__) - {"__version__"} - ERRORS:
        assert name in documented, f"docs/api.md leaves out flopcount.{name}"
        module = documented[name]
        assert lazy[name] in (module, f"flopcount.{module}"), f"{name}: documented from {module}, lives in {lazy[name]}"
    assert "::: flopcount.errors" in offered and all(lazy[e] == "flopcount.errors" for e in ERRORS)
    not_offered = set(documented) - set(flopcount.__all__) - {"errors"}  # the module of the error classes
    assert not not_offered, f"docs/api.md documents {sorted(not_offered)} among the names flopcount offers"
    assert set(_documented(rest)).isdisjoint(flopcount.__all__)


def test_the_docstring_style_is_the_one_mkdocstrings_reads():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "python"))
    (mkdocstrings,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    assert mkdocstrings["handlers"]["python"]["options"]["docstring_style"] == "numpy"
    import inspect

    for name in set(flopcount.__all__) - {"__version__", "CONVENTIONS"}:
        doc = inspect.getdoc(getattr(flopcount, name)) or ""
        assert not re.search(r"^\s*(Args|Arguments|Returns|Raises):\s*$|:param \w+:", doc, re.MULTILINE), \
            f"flopcount.{name}'s docstring is not numpydoc"


def test_the_hook_renders_roles_and_literals_as_code():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    render_roles = hooks.render_roles
    assert render_roles(":class:<code>~flopcount.options.CountOptions</code>") == "<code>CountOptions</code>"
    assert render_roles(":func:`flopcount.count`, ``x``") == "<code>flopcount.count</code>, <code>x</code>"
    assert render_roles("<code>```console</code>") == "<code>```console</code>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"needs {module} (pip install '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                          "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)))


def _section(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    end = page.find('class="doc doc-heading"', start + 50)
    return page[start:end]


def test_the_api_page_renders_each_parameter_on_its_own(site):
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert not re.search(r":(class|func|meth|mod|attr|data|exc):", page), "a Sphinx role left as raw text"
    assert "``" not in page, "a reST literal left as raw text"
    count = _text(_section(page, "flopcount.counting.count"))
    # count's table holds model alone; the settings are CountOptions' fields, each with its own type and text
    params = count[count.index("Parameters:"):count.index("Returns:")]
    assert "model" in params and "input_shapes" not in params and "batch" not in params
    options = _text(_section(page, "flopcount.options.CountOptions"))
    assert "batch ( int , optional) Sets dim 0 of every input" in options
    assert "strict bool Raise UnsupportedOperatorError" in options


def test_wide_tables_fit_or_wrap(site):
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert "overflow-wrap: anywhere" in css and "overflow-x: auto" in css
    for page in ("memory", "parallel"):
        assert 'href="../stylesheets/extra.css"' in (site / page / "index.html").read_text(encoding="utf-8")
