"""The docs site's hook (mkdocs.yml: ``hooks``; left out of the site by ``exclude_docs``): the Sphinx roles of the
docstrings rendered as code.

The package's docstrings are numpydoc, with Sphinx roles for cross-references
(:class:`~flopcount.options.CountOptions`), the house style the networkx docs follow; mkdocstrings renders numpydoc's sections but leaves the roles as raw
text. Each ``:role:`target``` on a page becomes ``target`` as code (with a leading ``~``, its last component), so
the API page reads as the docstrings do in Python's ``help()``.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):(?:<code>|`)(~?)([\w.]+)(?:</code>|`)")
#: a reST literal left as text where mkdocstrings writes a docstring's type unprocessed (a parameter's type column)
LITERAL = re.compile(r"(?<![`\w])``([^`<>\n]+?)``(?![`\w])")


def render_roles(html: str) -> str:
    """``html`` with each Sphinx role, and each reST literal left as text, written as code.

    >>> render_roles(':class:<code>~flopcount.options.CountOptions</code> and :func:`flopcount.count`')
    '<code>CountOptions</code> and <code>flopcount.count</code>'
    >>> render_roles('<td>``"full"`` or a mask</td>')
    '<td><code>"full"</code> or a mask</td>'
    """
    html = ROLE.sub(lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>", html)
    return LITERAL.sub(r"<code>\1</code>", html)


def on_page_content(html: str, page, **_: object) -> str:
    # only the API page is written from docstrings; the other pages' text is markdown, left as it is
    return render_roles(html) if page.file.src_path == "api.md" else html
