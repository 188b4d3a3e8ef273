"""What the framework frontends share: the export cache, the progress line, ``MODULE:FACTORY`` loading, keeping
exporters quiet, and one-line error text.

Nothing here knows a framework: :mod:`flopcount.frontends.torch` and :mod:`flopcount.frontends.keras` pass in what
differs (their name, their logger, how to recognise their model class). Importing this module needs only onnx.

**Cache.** Each frontend hashes everything its exported graph depends on except weight values into a key; the
graph is stored as ``<frontend>-<key>.onnx`` in ``cache_dir=``, else ``$FLOPCOUNT_CACHE`` (``0``/``off`` disables
it), else ``$XDG_CACHE_HOME/flopcount`` or ``~/.cache/flopcount``; ``cache_dir=False`` disables caching. Files are
small (weightless graphs) and written atomically. An entry records the key and input signature it was written for
and the digest of its content, and is served only where they match and ONNX's checker passes
(:mod:`flopcount.frontends.cache_entry`); anything else is a one-line warning naming the file, then a new export.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import onnx

from flopcount.errors import FrontendError, OutputError, UsageError, first_line
from flopcount.output.files import atomic_path, write_atomic

if TYPE_CHECKING:
    from flopcount.options import CountOptions

__all__ = [
    "CACHE_ENV",
    "NOT_A_LEAF",
    "StateDescriber",
    "bytes_digest",
    "cache_folder",
    "cache_key",
    "canonical",
    "canonical_json",
    "captured_fd",
    "check_frontend_arguments",
    "class_digest",
    "default_cache_dir",
    "dist_version",
    "entry_path",
    "load_factory",
    "options_of",
    "parse_factory",
    "plain",
    "progress",
    "quiet",
    "read_cache",
    "shorten",
    "without_addresses",
    "write_cache",
]

#: Environment variable naming the export cache folder; ``0``, ``off``, ``false`` or ``no`` disable the cache.
CACHE_ENV = "FLOPCOUNT_CACHE"
_CACHE_OFF = frozenset({"0", "off", "false", "no", "none"})
_SPINNER = "|/-\\"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


def options_of(caller: str, count_kwargs: Mapping[str, Any],
               training: bool | None = None) -> tuple[CountOptions, bool]:
    """The :class:`~flopcount.options.CountOptions` a frontend's keywords make, checked at the call (before any
    export), and its training flag resolved: ``None`` follows ``mode``; a training graph (``training=True``) is
    counted with ``mode="train"`` unless ``mode`` is given.

    A keyword that is no setting of a count is a ``TypeError`` naming ``caller`` and the settings; a setting of the
    wrong type or range is a :class:`UsageError` naming ``caller`` (or ``count``) and the argument.

    >>> options_of("from_keras", {"batch": 8}, training=True)[0].mode
    'train'
    >>> options_of("from_keras", {"colour": "red"})
    Traceback (most recent call last):
    ...
    TypeError: from_keras: got an unexpected keyword argument 'colour'; it passes these to flopcount.count: \
input_shapes, batch, convention, strict, input_values, loop_trips, mode, optimizer, trainable_inputs, trainable, \
frozen, attention, memory, free_ops, recompute, parallel, microbatches, schedule, expert_load, token_dispatcher
    """
    import dataclasses

    from flopcount.calls import CountArguments, check_count_arguments
    from flopcount.options import CountOptions

    names = [f.name for f in dataclasses.fields(CountOptions)]
    unknown = [k for k in count_kwargs if k not in names]
    if unknown:
        raise TypeError(f"{caller}: got an unexpected keyword argument {unknown[0]!r}; it passes these to "
                        f"flopcount.count: {', '.join(names)}")
    checked = {f.name for f in dataclasses.fields(CountArguments)}
    check_count_arguments(CountArguments(**{k: v for k, v in count_kwargs.items() if k in checked}), caller)
    settings = dict(count_kwargs)
    if training is None:
        training = settings.get("mode") == "train"
    if training:
        settings.setdefault("mode", "train")
    return CountOptions(**settings), bool(training)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:77] + '...'} ({type(value).__name__})"


def check_frontend_arguments(caller: str, *, training: Any = None, opset: Any = None, cache_dir: Any = None,
                             training_may_be_none: bool = True) -> None:
    """Refuse, naming it, a frontend argument of the wrong type or range (a :class:`UsageError`, before any import
    or conversion): ``training`` True or False (or None, where it follows ``mode``); ``opset`` a positive int;
    ``cache_dir`` a path, True, False or None.

    >>> check_frontend_arguments("from_keras", opset=18, cache_dir=False)
    >>> check_frontend_arguments("from_keras", opset="18")
    Traceback (most recent call last):
    ...
    flopcount.errors.UsageError: from_keras: opset must be a positive int such as 18, got '18' (str)
    """
    if not (isinstance(training, bool) or training is None and training_may_be_none):
        allowed = "True, False or None" if training_may_be_none else "True or False"
        raise UsageError(f"{caller}: training must be {allowed}, got {_shown(training)}")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int) or opset <= 0):
        raise UsageError(f"{caller}: opset must be a positive int such as 18, got {_shown(opset)}")
    if cache_dir is not None and not isinstance(cache_dir, (bool, str, os.PathLike)):
        raise UsageError(f"{caller}: cache_dir must be a folder path, True (the default folder) or False (no cache), "
                         f"got {_shown(cache_dir)}")


# ---------------------------------------------------------------------------------------------------------------
# Factories (--torch / --keras MODULE:FACTORY)
# ---------------------------------------------------------------------------------------------------------------


#: Parameters through which a factory loads pretrained weights, and the value that builds the model without them.
WEIGHT_PARAMETERS = {"weights": None, "pretrained": False}
#: Exceptions raised when a download fails (no network, an unreachable host).
_DOWNLOAD_ERRORS = ("URLError", "HTTPError", "ContentTooShortError", "gaierror", "ConnectionError",
                    "ConnectTimeout", "ReadTimeout")


def parse_factory(spec: str, option: str) -> tuple[str, str, tuple, dict[str, Any]]:
    """Split ``package.module:factory(arg, key=value, ...)`` into the module name, the (dotted) attribute and the
    call's positional and keyword arguments, which must be Python literals (numbers, strings, ``None``,
    ``True``/``False``, tuples, lists, dicts, sets): nothing in the spec is executed.

    >>> parse_factory("keras.applications:MobileNetV3Small(weights=None, input_shape=(224, 224, 3))", "--keras")
    ('keras.applications', 'MobileNetV3Small', (), {'weights': None, 'input_shape': (224, 224, 3)})
    >>> parse_factory("models:make_net", "--torch")
    ('models', 'make_net', (), {})
    """
    import ast

    module_name, sep, rest = spec.partition(":")
    attribute, paren, call = rest.partition("(")
    module_name, attribute = module_name.strip(), attribute.strip()
    example = "mypackage.models:make_net or mypackage.models:make_net(width=64, weights=None)"
    if not sep or not module_name or not attribute or (paren and not call.rstrip().endswith(")")):
        raise UsageError(f"{option} wants MODULE:FACTORY or MODULE:FACTORY(KEY=VALUE, ...) such as {example}, "
                         f"got {spec!r}")
    if not paren:
        return module_name, attribute, (), {}
    try:
        tree = ast.parse(f"f({call}", mode="eval").body
    except SyntaxError:
        raise UsageError(f"{option} {spec}: the factory's arguments are not a Python call's arguments; write them "
                         f"as {example}") from None
    if not isinstance(tree, ast.Call) or any(isinstance(a, ast.Starred) for a in tree.args) or any(
            k.arg is None for k in tree.keywords):
        raise UsageError(f"{option} {spec}: write the factory's arguments as KEY=VALUE, e.g. {example}")

    def literal(node: ast.expr, what: str) -> Any:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise UsageError(
                f"{option} {spec}: {what} = {ast.unparse(node)} is not a Python literal; arguments may be numbers, "
                "strings (quoted), None, True, False, tuples, lists and dicts of them"
            ) from None

    args = tuple(literal(a, f"argument {i + 1}") for i, a in enumerate(tree.args))
    kwargs = {k.arg: literal(k.value, k.arg) for k in tree.keywords}
    return module_name, attribute, args, kwargs


def load_factory(
    spec: str,
    *,
    option: str,
    frontend: str,
    kind: str,
    accepts: Callable[[Any], bool],
    import_framework: Callable[[], Any] = lambda: None,
) -> Any:
    """Import ``package.module:factory``, call the factory and return what it makes.

    ``spec`` may give the factory's arguments as a call with literal values,
    ``package.module:factory(key=value, ...)`` (see :func:`parse_factory`); without them it is called with none.
    The current directory is searched first (as ``python -m`` does); ``factory`` may be dotted
    (``models:Net.small``). ``option`` (``"--torch"``) and ``kind`` (``"a torch.nn.Module"``) word the messages;
    ``import_framework`` runs once the spec is well-formed (it raises FrontendError when the framework is missing);
    ``accepts`` checks the result.

    Weights are never needed: a factory whose ``weights`` parameter defaults to something other than ``None``
    (``keras.applications``: ``"imagenet"``), or whose ``pretrained`` defaults to true, is refused before it is
    called unless the spec gives that argument, so that nothing is downloaded behind the user's back; a call that
    fails while downloading says to pass ``weights=None``. Arguments the factory does not take are refused with
    the list of those it does.
    """
    module_name, attribute, args, kwargs = parse_factory(spec, option)
    import_framework()
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        namespace = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UsageError(
                f"{option} {spec}: cannot import module {module_name!r} ({e}); install its package, run flopcount "
                "from the folder that holds it, or add that folder to PYTHONPATH"
            ) from None
        raise UsageError(f"{option} {spec}: importing {module_name!r} failed: {e}; install {e.name!r}") from None
    except Exception as e:  # noqa: BLE001 - the user's module is broken: one line, not a traceback
        raise UsageError(
            f"{option} {spec}: importing {module_name!r} failed: {type(e).__name__}: {first_line(e)}; "
            "fix the module"
        ) from None
    try:
        factory = functools.reduce(getattr, attribute.split("."), namespace)
    except AttributeError:
        available = sorted(k for k, v in vars(namespace).items() if callable(v) and not k.startswith("_"))
        raise UsageError(
            f"{option} {spec}: module {module_name!r} has no attribute {attribute!r}; its callables: "
            + (", ".join(available[:20]) or "none")
        ) from None
    if not callable(factory):
        raise UsageError(f"{option} {spec}: {attribute!r} is a {type(factory).__name__}, not a callable factory")
    target = f"{module_name}:{attribute}"
    _check_factory_call(factory, args, kwargs, option=option, spec=spec, target=target)
    try:
        made = factory(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the user's factory failed: one line, not a traceback
        if any(type(c).__name__ in _DOWNLOAD_ERRORS or "URL fetch failure" in str(c) for c in chain(e)):
            raise FrontendError(
                f"{frontend}: calling {spec} failed while downloading ({type(e).__name__}: {first_line(e)}); "
                f"flopcount never reads weights: build the model without them, e.g. {option} "
                f"'{_with_argument(target, args, kwargs, 'weights', None)}'"
            ) from None
        raise FrontendError(
            f"{frontend}: calling {spec} failed: {type(e).__name__}: {first_line(e)}; the factory must return "
            f"{kind} (give its arguments as {option} '{target}(KEY=VALUE, ...)')"
        ) from None
    if not accepts(made):
        raise UsageError(f"{option} {spec}: the factory returned a {type(made).__name__}, not {kind}")
    return made


def _with_argument(target: str, args: tuple, kwargs: Mapping[str, Any], key: str, value: Any) -> str:
    """``target(args..., kwargs..., key=value)`` as a spec."""
    items = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in {**kwargs, key: value}.items()]
    return f"{target}({', '.join(items)})"


def _check_factory_call(factory: Callable, args: tuple, kwargs: Mapping[str, Any], *, option: str, spec: str,
                        target: str) -> None:
    """Refuse, before the call, arguments ``factory`` does not take, and a call that would load weights."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the call says
        return
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        parameters = str(signature.replace(return_annotation=inspect.Signature.empty))
        raise UsageError(
            f"{option} {spec}: {e}; {_call_name(target)} takes {shorten(parameters, 400)}; give its "
            f"arguments as {option} '{target}(KEY=VALUE, ...)'"
        ) from None
    for name, without in WEIGHT_PARAMETERS.items():
        parameter = signature.parameters.get(name)
        if parameter is None or name in bound.arguments or parameter.default is inspect.Parameter.empty:
            continue
        default = parameter.default
        if default is not None and default is not False:
            raise UsageError(
                f"{option} {spec}: {_call_name(target)} loads pretrained weights by default ({name}={default!r}), "
                f"and flopcount never reads weights; build the model without them: {option} "
                f"'{_with_argument(target, args, kwargs, name, without)}'"
            )


def _call_name(target: str) -> str:
    """``factory()`` for ``module:factory``."""
    return f"{target.partition(':')[2]}()"


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path | None:
    """``$FLOPCOUNT_CACHE`` (None where it says ``0``/``off``), else ``$XDG_CACHE_HOME/flopcount``, else
    ``~/.cache/flopcount``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return None if env.lower() in _CACHE_OFF else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flopcount"


def cache_folder(cache_dir: str | os.PathLike | bool | None) -> Path | None:
    """The folder a ``cache_dir=`` argument names: None or True: :func:`default_cache_dir`; False: no cache."""
    if cache_dir is False:
        return None
    if cache_dir is None or cache_dir is True:
        return default_cache_dir()
    return Path(cache_dir).expanduser()


def cache_key(document: Any) -> str:
    """SHA-256 of ``document`` as canonical JSON; what JSON cannot hold goes through :func:`canonical`, so that the
    key is the same in every process (whatever ``PYTHONHASHSEED`` and wherever objects live in memory).

    >>> cache_key({"b": {3, 1, 2}, "a": 1}) == cache_key({"a": 1, "b": {2, 3, 1}})
    True
    """
    return hashlib.sha256(canonical_json(document).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys, :func:`canonical` standing in for what JSON cannot hold."""
    return json.dumps(value, sort_keys=True, default=canonical)


def canonical(value: Any) -> Any:
    """A JSON-able stand-in for ``value`` that is the same in every process: a set's elements in sorted order (its
    iteration order follows the per-process salted hashes of strings), a function or class by its qualified name and
    the digest of its source file, bytes by their digest, anything else by its ``repr`` with memory addresses left
    out (``<object at 0x7f...>``)."""
    if isinstance(value, (set, frozenset)):
        return [type(value).__name__, sorted((canonical_json(v) for v in value))]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", bytes_digest(bytes(value))]
    if inspect.isfunction(value) or inspect.isclass(value):
        module = str(getattr(value, "__module__", ""))
        return [type(value).__name__, f"{module}.{value.__qualname__}", module_file_digest(module)]
    return without_addresses(repr(value))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def without_addresses(text: str) -> str:
    """``text`` without the memory addresses that default reprs hold (they differ in every process).

    >>> without_addresses("<function <lambda> at 0x7f3a2c1d5e40>")
    '<function <lambda>>'
    """
    return _ADDRESS.sub("", text)


def dist_version(distribution: str) -> str:
    """The installed version of ``distribution``, or "" where it is not installed."""
    try:
        return _dist_version(distribution)
    except PackageNotFoundError:
        return ""


@functools.cache
def class_digest(cls: type, framework: tuple[str, ...]) -> str:
    """Digest of the source files that define ``cls`` and its bases, skipping classes of the top-level packages
    ``framework`` (covered by their version) and builtins; the qualified name where there is no source file.

    Whole files are hashed (not the class's own lines): parsing a large file to find one class takes seconds,
    and a file that changed elsewhere only costs a re-export."""
    digest = hashlib.sha256()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in (*framework, "builtins"):
            continue
        digest.update(f"{klass.__module__}.{klass.__qualname__}".encode())
        digest.update(module_file_digest(klass.__module__).encode())
    return digest.hexdigest()


def module_file_digest(module_name: str) -> str:
    """Digest of the source file of the imported module ``module_name`` ("" where there is none)."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path:
        return ""
    try:
        stat = os.stat(path)
    except OSError:
        return ""
    return _file_digest(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1024)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: What a ``leaf`` function of :class:`StateDescriber` returns for values it does not describe itself.
NOT_A_LEAF = object()


class StateDescriber:
    """Turns the state a model's ``forward`` may read (module attributes, configuration objects, hooks, functions)
    into JSON-able data for a cache key, or says why it cannot (:attr:`unsound`; then nothing is cached).

    Plain values are kept; containers, objects with a ``__dict__`` (configuration objects, dataclasses) and their
    private attributes are described recursively (a shared object is described once and then referred to);
    functions by their qualified name, the digest of their source file, their defaults and closure; classes by the
    digest of their source files (:func:`class_digest`).
    ``leaf(value)`` describes framework values (tensors, dtypes) or returns :data:`NOT_A_LEAF`. Anything else
    (objects without a ``__dict__``, too deep a nesting) makes the description unsound. Global variables that a
    function reads are not covered.
    """

    MAX_DEPTH = 12

    def __init__(self, leaf: Callable[[Any], Any], framework: tuple[str, ...]):
        self.leaf, self.framework = leaf, framework
        self.unsound: str | None = None
        self._named: dict[int, str] = {}
        self._seen: dict[int, str] = {}
        self._keep: list[Any] = []  # keeps described objects alive, so their ids stay theirs

    #: Private attributes that cache a ``hash()`` (``_hash``, transformers' ``GenerationConfig._original_object_hash``):
    #: Python salts the hashes of strings per process (``PYTHONHASHSEED``), and such a cache is derived from the
    #: object's other state, which is described. Only int values are left out.
    HASH_CACHE = re.compile(r"_(\w*_)?hash")

    def state(self, obj: Any) -> dict[str, Any]:
        """The attributes of ``obj`` to describe: ``vars(obj)`` without the caches of its own hash
        (:attr:`HASH_CACHE`)."""
        return {k: v for k, v in vars(obj).items()
                if not (isinstance(v, int) and not isinstance(v, bool) and self.HASH_CACHE.fullmatch(k))}

    def name(self, obj: Any, label: str) -> None:
        """Refer to ``obj`` by ``label`` instead of describing it (the modules of the tree are described apart)."""
        self._named.setdefault(id(obj), label)
        self._keep.append(obj)

    def object_type(self, obj: Any) -> list[str]:
        cls = type(obj)
        return [f"{cls.__module__}.{cls.__qualname__}", class_digest(cls, self.framework)]

    def describe(self, value: Any, depth: int = 0) -> Any:
        if self.unsound is not None:
            return None
        if isinstance(value, (bool, int, float, str, type(None))):
            return value if not isinstance(value, float) or value == value else "nan"
        if id(value) in self._named:
            return ["ref", self._named[id(value)]]
        if depth > self.MAX_DEPTH:
            self.unsound = f"state nested deeper than {self.MAX_DEPTH} levels ({type(value).__name__})"
            return None
        described = self.leaf(value)
        if described is not NOT_A_LEAF:
            return described
        if isinstance(value, enum.Enum):
            return [self.object_type(value)[0], self.describe(value.value, depth + 1)]
        if isinstance(value, (bytes, bytearray)):
            return ["bytes", bytes_digest(bytes(value))]
        if isinstance(value, (tuple, list)):
            return [type(value).__name__, [self.describe(v, depth + 1) for v in value]]
        if isinstance(value, (set, frozenset)):
            return [type(value).__name__, [self.describe(v, depth + 1) for v in self._in_canonical_order(value, depth)]]
        if id(value) in self._seen:
            return ["ref", self._seen[id(value)]]
        self._seen[id(value)] = f"#{len(self._seen)}"
        self._keep.append(value)
        if isinstance(value, Mapping):
            return ["dict", [[self.describe(k, depth + 1), self.describe(v, depth + 1)] for k, v in value.items()]]
        if isinstance(value, type):
            return ["class", *self.object_type_of_class(value)]
        if isinstance(value, functools.partial):
            return ["partial", self.describe(value.func, depth + 1), self.describe(value.args, depth + 1),
                    self.describe(value.keywords, depth + 1)]
        if inspect.ismethod(value):
            return ["method", self.describe(value.__func__, depth + 1), self.describe(value.__self__, depth + 1)]
        if inspect.isfunction(value):
            return self._function(value, depth)
        if inspect.isbuiltin(value) or inspect.ismethoddescriptor(value) or type(value).__name__ in _BUILTIN_CALLABLES:
            module = getattr(value, "__module__", None) or getattr(getattr(value, "__objclass__", None), "__module__", "")
            return ["builtin", str(module), getattr(value, "__qualname__", None) or without_addresses(repr(value))]
        if hasattr(value, "__dict__"):
            return ["object", *self.object_type(value), self.describe(self.state(value), depth + 1)]
        self.unsound = f"cannot describe a {type(value).__module__}.{type(value).__qualname__} it holds"
        return None

    def _in_canonical_order(self, values: set | frozenset, depth: int) -> list[Any]:
        """The elements of a set sorted by their description, each described from the describer's present state
        (a set iterates in the order of its elements' per-process hashes, and the objects described first would
        take the first reference labels)."""
        def provisional(value: Any) -> str:
            probe = object.__new__(StateDescriber)
            probe.__dict__.update(self.__dict__, _seen=dict(self._seen), _keep=[])
            return canonical_json(probe.describe(value, depth + 1))

        return [v for _, v in sorted(((provisional(v), i), v) for i, v in enumerate(values))]

    def object_type_of_class(self, cls: type) -> list[str]:
        return [f"{cls.__module__}.{cls.__qualname__}", class_digest(cls, self.framework)]

    def _function(self, fn: Any, depth: int) -> Any:
        source = module_file_digest(str(fn.__module__))
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(self.describe(cell.cell_contents, depth + 1))
            except ValueError:  # an empty cell
                cells.append(None)
        return ["function", f"{fn.__module__}.{fn.__qualname__}", source, self.describe(fn.__defaults__, depth + 1),
                self.describe(fn.__kwdefaults__, depth + 1), cells]


_BUILTIN_CALLABLES = frozenset({"builtin_function_or_method", "wrapper_descriptor", "method-wrapper", "ufunc"})


def plain(value: Any) -> bool:
    """A JSON-able scalar, or a tuple or list of them."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value)


def export_through_cache(
    cache_dir: str | os.PathLike | bool | None,
    frontend: str,
    key: Callable[[], str],
    produce: Callable[[], onnx.ModelProto],
    path: str | os.PathLike | None,
    log: logging.Logger,
    signature: Any = None,
) -> onnx.ModelProto:
    """The weightless model from the cache (``<frontend>-<key>.onnx`` in the cache folder), else from
    ``produce()``, stored for next time; also written to ``path`` when one is given. ``key`` is
    called only when a cache folder is in use; where it returns None (no sound key), nothing is cached.

    An entry records its key and the call's input ``signature`` (JSON-able: the graph inputs' names, shapes and
    types) and is served only where both match, its content matches its digest, its graph is non-empty and ONNX's
    checker passes (:mod:`flopcount.frontends.cache_entry`); any other entry is a one-line warning naming the file,
    and the model is exported again and stored over it."""
    folder = cache_folder(cache_dir)
    digest = key() if folder is not None else None
    cached = entry_path(folder, frontend, digest) if digest is not None else None
    model = read_cache(cached, log, digest, signature) if cached is not None else None
    if model is None:
        model = produce()
        if cached is not None:
            _store(cached, model, digest, signature, log)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, "ONNX model") as tmp:
            onnx.save_model(model, tmp)
    return model


def entry_path(folder: Path, frontend: str, key: str) -> Path:
    """Where the cache entry of ``frontend``'s export under ``key`` lies in the cache folder ``folder``."""
    return folder / f"{frontend}-{key[:40]}.onnx"


def _store(path: Path, model: onnx.ModelProto, digest: str, signature: Any, log: logging.Logger) -> None:
    """Write ``model`` sealed with its key and signature, where it passes ONNX's checker (an export the checker
    refuses is counted but not cached, so that it is not refused as a damaged entry on every later read)."""
    from .cache_entry import seal, unseal

    entry = seal(model, digest, signature)
    if isinstance(unseal(entry.SerializeToString(), digest, signature), str):
        log.info("export not cached: ONNX's checker refuses the exported graph")
        return
    write_cache(path, entry, log)


def read_cache(path: Path, log: logging.Logger, key: str, signature: Any) -> onnx.ModelProto | None:
    """The cached model at ``path``, verified for ``key`` and ``signature``
    (:func:`flopcount.frontends.cache_entry.unseal`); None where it is missing, and a one-line warning naming the
    file and None where it is damaged, planted or written for another call (the caller exports again)."""
    from .cache_entry import unseal

    if not path.is_file():
        log.debug("export cache miss: %s", path)
        return None
    try:
        data = path.read_bytes()
    except OSError as e:
        log.warning("ignoring the export cache entry %s (%s); exporting again", path, e.strerror or e)
        return None
    model = unseal(data, key, signature)
    if isinstance(model, str):
        log.warning("ignoring the export cache entry %s: %s; exporting again", path, model)
        return None
    log.info("export cache hit: %s", path)
    return model


def write_cache(path: Path, model: onnx.ModelProto | bytes, log: logging.Logger) -> None:
    """Write ``model`` (or bytes) to ``path`` whole (:func:`flopcount.output.files.write_atomic`: a concurrent reader sees the old
    entry or the whole new one, never a part); a folder that cannot be written is a warning, not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, model if isinstance(model, bytes) else model.SerializeToString(), "export cache entry")
    except (OSError, OutputError) as e:
        log.warning(
            "cannot write the export cache %s (%s); set %s or cache_dir= to a writable folder, or disable it with "
            "cache_dir=False", path.parent, first_line(e) if isinstance(e, OutputError) else e.strerror or e,
            CACHE_ENV,
        )
        return
    log.debug("export cached: %s", path)


# ---------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def progress(label: str, *, delay: float, log: logging.Logger, stream: TextIO | None = None) -> Iterator[None]:
    """While the body runs longer than ``delay`` seconds: a one-line spinner on ``stream`` (default: stderr) when
    it is a terminal, else one INFO record on ``log``; nothing where ``log`` shows errors only (the command line's
    ``--quiet``)."""
    if not log.isEnabledFor(logging.WARNING):
        yield
        return
    stream = sys.stderr if stream is None else stream
    done = threading.Event()
    start = time.perf_counter()

    def run() -> None:
        if done.wait(delay):
            return
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            log.info("%s (running for over %g s)", label, delay)
            return
        width, frame = 0, 0
        try:
            while not done.is_set():
                line = f"{_SPINNER[frame % len(_SPINNER)]} flopcount: {label} {time.perf_counter() - start:.0f} s"
                stream.write("\r" + line)
                stream.flush()
                width, frame = max(width, len(line)), frame + 1
                done.wait(0.1)
            stream.write("\r" + " " * width + "\r")
            stream.flush()
        except (OSError, ValueError):  # stderr closed under us
            pass

    thread = threading.Thread(target=run, name="flopcount-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Quiet exporters
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet(logger_names: Sequence[str], log: logging.Logger, fds: Sequence[int] = (1,),
          level: int = logging.ERROR) -> Iterator[None]:
    """Keep an exporter's warnings, log records below ``level`` and what it writes to the file descriptors
    ``fds`` (C++ code writes there directly) out of the user's output; they go to ``log`` at DEBUG instead.
    Unless ``log`` is at DEBUG, the loggers ``logger_names`` are set to ``level`` meanwhile."""
    debug = log.isEnabledFor(logging.DEBUG)
    loggers = [logging.getLogger(name) for name in logger_names]
    levels = [logger.level for logger in loggers]
    captured: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not debug:
            for logger in loggers:
                logger.setLevel(level)
        try:
            with contextlib.ExitStack() as stack:
                for fd in fds:
                    stack.enter_context(captured_fd(fd, captured))
                yield
        finally:
            for logger, saved in zip(loggers, levels):
                logger.setLevel(saved)
    for w in caught:
        log.debug("exporter warning: %s: %s", w.category.__name__, w.message)
    if any(text.strip() for text in captured):
        log.debug("exporter output:\n%s", "".join(captured).rstrip())


@contextlib.contextmanager
def captured_fd(fd: int, sink: list[str]) -> Iterator[TextIO | None]:
    """Redirect file descriptor ``fd`` (1 or 2) to a temporary file and append what it got to ``sink``.

    Yields a text stream on the original descriptor (for a progress line meanwhile), or None where there is no
    such descriptor.
    """
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    with contextlib.suppress(Exception):
        stream.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no such descriptor at all
        yield None
        return
    with tempfile.TemporaryFile() as tmp, os.fdopen(os.dup(saved), "w", errors="replace") as original:
        os.dup2(tmp.fileno(), fd)
        try:
            yield original
        finally:
            with contextlib.suppress(Exception):
                stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


# ---------------------------------------------------------------------------------------------------------------
# Error text
# ---------------------------------------------------------------------------------------------------------------


def chain(e: BaseException | None) -> Iterator[BaseException]:
    """``e`` and the exceptions it was raised from or during (at most 8)."""
    seen = set()
    while e is not None and id(e) not in seen and len(seen) < 8:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_value(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` is stored in the graph (not an external reference) and holds one value throughout: a
    constant an exporter made (the ones of an affine-free LayerNorm's scale), never a weight of a meta module."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    values = onnx.numpy_helper.to_array(tensor)
    return values.size > 0 and bool((values == values.flat[0]).all())
