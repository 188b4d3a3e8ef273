"""``MODULE:FACTORY(KEY=VALUE, ...)`` factories of ``--torch`` and ``--keras`` (frontends/common.py), without any
framework: the factories here return plain objects."""

from __future__ import annotations

import textwrap

import pytest

from flopcount import FrontendError, UsageError
from flopcount.frontends import common


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of factories importable by a name unique to the test."""
    name = f"fc_common_factories_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import urllib.error

        def net(width, depth=2, *, weights=None):
            return {"width": width, "depth": depth, "weights": weights}

        def application(input_shape=None, classes=1000, weights="imagenet"):
            return {"input_shape": input_shape, "classes": classes, "weights": weights}

        def legacy(pretrained=True):
            return {"pretrained": pretrained}

        def downloading():
            try:
                raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
            except urllib.error.URLError as e:  # as keras.utils.get_file words it
                raise Exception("URL fetch failure on https://example.invalid/w.h5: None -- " + str(e.reason)) from e

        def failing(width=3):
            raise ValueError("width must be even")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def load(spec: str):
    return common.load_factory(spec, option="--keras", frontend="keras", kind="a model", accepts=lambda made: True)


@pytest.mark.parametrize(
    "call, made",
    [
        pytest.param("net(7)", {"width": 7, "depth": 2, "weights": None}, id="positional"),
        pytest.param("net(width=7, depth=3)", {"width": 7, "depth": 3, "weights": None}, id="keywords"),
        pytest.param("application(weights=None, input_shape=(224, 224, 3), classes=10)",
                     {"input_shape": (224, 224, 3), "classes": 10, "weights": None}, id="tuple-and-none"),
        pytest.param("legacy(pretrained=False)", {"pretrained": False}, id="pretrained-false"),
        pytest.param("net( 5 , depth = -1 , )", {"width": 5, "depth": -1, "weights": None}, id="spacing"),
    ],
)
def test_arguments_are_python_literals(factories, call, made):
    assert load(f"{factories}:{call}") == made


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param("application", "application() loads pretrained weights by default (weights='imagenet'), and "
                     "flopcount never reads weights; build the model without them: --keras "
                     "'{m}:application(weights=None)'", id="weights-default"),
        pytest.param("application(classes=10)", "--keras '{m}:application(classes=10, weights=None)'",
                     id="weights-default-keeps-other-arguments"),
        pytest.param("legacy", "legacy() loads pretrained weights by default (pretrained=True)", id="pretrained"),
        pytest.param("net(7, wdth=3)", "got an unexpected keyword argument 'wdth'; net() takes (width, depth=2, *, "
                     "weights=None); give its arguments as --keras '{m}:net(KEY=VALUE, ...)'", id="unknown-keyword"),
        pytest.param("net", "missing a required argument: 'width'; net() takes (width, depth=2, *, weights=None)",
                     id="missing-argument"),
        pytest.param("net(width=os.getcwd())", "width = os.getcwd() is not a Python literal", id="not-a-literal"),
        pytest.param("net(width=7", "--keras wants MODULE:FACTORY or MODULE:FACTORY(KEY=VALUE, ...)", id="unclosed"),
        pytest.param("net(**{'width': 7})", "write the factory's arguments as KEY=VALUE", id="double-star"),
        pytest.param("net(width=)", "the factory's arguments are not a Python call's arguments", id="syntax"),
    ],
)
def test_usage_errors_name_the_fix(factories, call, message):
    with pytest.raises(UsageError) as caught:
        load(f"{factories}:{call}")
    assert message.format(m=factories) in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_failed_download_says_to_build_without_weights(factories):
    with pytest.raises(FrontendError) as caught:
        load(f"{factories}:downloading")
    message = str(caught.value)
    assert message.startswith(f"keras: calling {factories}:downloading failed while downloading (Exception: URL "
                              "fetch failure on https://example.invalid/w.h5")
    assert message.endswith(f"flopcount never reads weights: build the model without them, e.g. --keras "
                            f"'{factories}:downloading(weights=None)'")


def test_a_failing_factory_is_one_line_naming_the_call(factories):
    with pytest.raises(FrontendError) as caught:
        load(f"{factories}:failing(width=3)")
    assert str(caught.value) == (f"keras: calling {factories}:failing(width=3) failed: ValueError: width must be even; "
                                 f"the factory must return a model (give its arguments as --keras "
                                 f"'{factories}:failing(KEY=VALUE, ...)')")
