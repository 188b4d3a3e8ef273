"""The flopcount version: written here once, and read from here by the package build (pyproject.toml's
``[tool.setuptools.dynamic]``), so that the installed package's metadata and ``__version__`` agree, and no module
that writes a report's ``tool`` field pays for reading package metadata at run time.

Kept apart from the package face so that a module writing a report's ``tool`` field needs nothing else.

>>> from flopcount.version import __version__
>>> isinstance(__version__, str)
True
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
