"""The installed flopcount's version, read from its package metadata (``0.0.0+unknown`` in a bare source tree).

Kept apart from the package face so that a module writing a report's ``tool`` field needs nothing else.

>>> from flopcount.version import __version__
>>> isinstance(__version__, str)
True
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("flopcount")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"
