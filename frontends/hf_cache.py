"""A ``--hf`` count served from the export cache without importing torch or transformers.

A count of a configuration imports torch and transformers to build the model, to export it (each export cached
under :func:`flopcount.frontends.torch_cache.fingerprint`, a key that needs the built module) and to read from the
module what the count of each export takes (:class:`~flopcount.frontends.exported.Exported`) and how its stack of
layers was counted. Importing the two costs about 4 s of CPU, most of a repeated count. So after a count, these are
written beside the exports as a *recipe* (``hf-<key>.json``), under a key computed from the configuration file
and the installed versions alone; a later count of the same key reads the recipe, takes the exports from the cache
(each checked as any entry is: :mod:`flopcount.frontends.cache_entry`) and counts them, importing neither framework.
Where anything is missing or does not match, the count is made from the configuration as before.

The key (:func:`recipe_key`, the one rule) is the SHA-256 of:

* the configuration: the bytes of its ``config.json`` (a path), or its canonical JSON (a dict);
* the call: the input shapes, ``training``, ``opset``, ``repeated_layers``, ``trust_remote_code`` and the settings
  the frontend reads before counting (``mode``, ``batch``, ``trainable_inputs``, ``trainable``, ``attention``);
* the installed versions of transformers and of the distributions an export depends on
  (:data:`~flopcount.frontends.torch_cache.EXPORT_DISTRIBUTIONS`: torch, onnx, onnxscript, onnx-ir, flopcount; their
  package metadata, read without importing them) and Python's;
* the export cache format (:data:`~flopcount.frontends.torch_cache.CACHE_FORMAT`) and the recipe's
  (:data:`RECIPE_FORMAT`);
* the source files of the frontends, of the parameter classification and of the shared limits, which decide what a
  recipe holds and what a configuration may ask for.

No recipe is read for a Hub id, a configuration object, a configuration whose classes live in its folder
(``auto_map``), ``generate`` or ``capacity_factor``, or attention given as masks; none is written for a
mixture-of-experts model (its summary reads the module), a count with its configuration's attention masks, or an
export without a sound key.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopcount.errors import first_line
from flopcount.reporting.layers import RepeatedLayers

from . import common
from .exported import Exported
from .torch_cache import CACHE_FORMAT, EXPORT_DISTRIBUTIONS

log = logging.getLogger(__name__.removesuffix("_cache"))  # the hf frontend's logger

__all__ = ["RECIPE_FORMAT", "Recipe", "RecipeCall", "read_recipe", "recipe_key", "recipe_path", "write_recipe"]

#: Version of the recipe's layout; bump when what a recipe holds, or how it is read, changes.
RECIPE_FORMAT = 2
#: The distributions whose installed versions the key holds: an export's, and transformers.
VERSIONED = (*EXPORT_DISTRIBUTIONS, "transformers")
#: The settings of a count the frontend reads before counting (the rest apply to the count of each export).
READ_SETTINGS = ("mode", "batch", "trainable_inputs", "trainable", "attention")


@dataclasses.dataclass
class Recipe:
    """What a ``--hf`` count takes from torch and transformers, filled while it is made.

    ``counts``: each export counted, in order; ``stack``: where the stack was extended, ``[layers, path, first,
    period, summary]`` (its last two counts are of the 1- and 2-block models), else None (its last count is of the
    whole model) and ``layers`` the report's :class:`~flopcount.reporting.layers.RepeatedLayers`;
    ``branches``: the export branches of transformers' code; ``sound``: False where the count must not be served
    from it."""

    counts: list[Exported] = dataclasses.field(default_factory=list)
    stack: list | None = None
    layers: RepeatedLayers | None = None
    branches: list[str] = dataclasses.field(default_factory=list)
    sound: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"counts": [e.as_dict() for e in self.counts], "stack": self.stack,
                "layers": None if self.layers is None else self.layers.as_dict(),
                "branches": list(self.branches)}


@dataclasses.dataclass(frozen=True)
class RecipeCall:
    """The arguments of a ``--hf`` count that its recipe key holds."""

    config: Any
    input_shapes: Any
    options: Any
    training: bool | None
    export: Mapping[str, Any]
    repeated_layers: str
    trust_remote_code: bool


def recipe_key(call: RecipeCall) -> str | None:
    """The recipe key of ``call`` (see the module's docstring), None where no recipe serves it."""
    config = _config_text(call.config)
    if config is None or not isinstance(call.options.attention, str):
        return None
    document = {
        "format": [RECIPE_FORMAT, CACHE_FORMAT],
        "config": config,
        "call": {"input_shapes": call.input_shapes, "training": call.training, "export": dict(call.export),
                 "repeated_layers": call.repeated_layers, "trust_remote_code": bool(call.trust_remote_code),
                 "settings": {name: getattr(call.options, name) for name in READ_SETTINGS}},
        "versions": {**{name: common.dist_version(name) for name in VERSIONED},
                     "python": list(sys.version_info[:3])},
        "sources": _sources_digest(),
    }
    try:
        return common.cache_key(document)
    except (TypeError, ValueError, RecursionError):  # settings JSON cannot describe: no recipe
        return None


def _config_text(config: Any) -> str | None:
    """The configuration as the key holds it, None where no recipe serves it."""
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        try:
            text = path.read_bytes().decode()
            document = json.loads(text)
        except (OSError, ValueError, RecursionError):  # missing (a Hub id), unreadable: the slow path says why
            return None
    elif isinstance(config, Mapping):
        document = dict(config)
        try:
            text = common.canonical_json(document)
        except (TypeError, ValueError, RecursionError):
            return None
    else:
        return None
    return text if isinstance(document, dict) and not document.get("auto_map") else None


@functools.cache
def _sources_digest() -> str:
    """SHA-256 of the frontends' source files, the parameter classification's and the shared limits', in name
    order."""
    from flopcount import limits
    from flopcount.pipeline import parameters

    digest = hashlib.sha256()
    for path in [*sorted(Path(__file__).parent.glob("*.py")), Path(parameters.__file__), Path(limits.__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def recipe_path(folder: Path, key: str) -> Path:
    return folder / f"hf-{key[:40]}.json"


def read_recipe(folder: Path, key: str) -> Recipe | None:
    """The recipe of ``key`` in ``folder``; None where there is none, and a one-line warning and None where it is
    unreadable or written for another key."""
    path = recipe_path(folder, key)
    if not path.is_file():
        log.debug("export cache recipe miss: %s", path)
        return None
    try:
        document = json.loads(path.read_bytes())
        if document.get("format") != RECIPE_FORMAT or document.get("key") != key:
            raise ValueError("written for another key or format")
        stack, layers = document["stack"], document["layers"]
        if stack is not None and (len(stack) != 5 or not all(isinstance(v, int) for v in (stack[0], *stack[2:4]))
                                  or not all(isinstance(v, str) for v in (stack[1], stack[4]))):
            raise ValueError("a malformed stack")
        recipe = Recipe([Exported.from_dict(e) for e in document["counts"]], stack,
                        None if layers is None else RepeatedLayers(**layers), [str(b) for b in document["branches"]])
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        log.warning("ignoring the export cache recipe %s (%s); counting from the configuration", path,
                    first_line(e) if str(e) else type(e).__name__)
        return None
    if any(e.key is None for e in recipe.counts) or len(recipe.counts) != (1 if stack is None else 2):
        log.warning("ignoring the export cache recipe %s (its exports are not named); counting from the "
                    "configuration", path)
        return None
    return recipe


def write_recipe(folder: Path, key: str, recipe: Recipe) -> None:
    """Write ``recipe`` for ``key`` where it is sound and names every export it counts."""
    if not recipe.sound or any(e.key is None for e in recipe.counts):
        log.debug("no export cache recipe written for this count")
        return
    document = {"format": RECIPE_FORMAT, "key": key, **recipe.as_dict()}
    common.write_cache(recipe_path(folder, key), json.dumps(document, sort_keys=True).encode(), log)
