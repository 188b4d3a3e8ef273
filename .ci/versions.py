"""Print the versions of the frameworks a CI lane runs, one line: ``label: torch 2.13.0+cpu, transformers 5.24.0, ...``.

    python .ci/versions.py LABEL

A package that is not installed shows as ``-``.
"""

from __future__ import annotations

import sys
from importlib import metadata

PACKAGES = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "tensorflow-cpu", "keras", "tf2onnx",
            "skl2onnx", "scikit-learn", "numpy", "protobuf")


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


if __name__ == "__main__":
    label = sys.argv[1] if len(sys.argv) > 1 else "lane"
    print(f"{label}: python {sys.version.split()[0]}, " + ", ".join(f"{p} {version(p)}" for p in PACKAGES))
