"""What a model is on disk: the registry of named models, pulling them into the local cache,
validating model directories, the tokenizer, chat templates and incremental detokenizer, the
chained block hash (shared by the engine and the router) and `SamplingParams`.

Torch-free: engine/, cluster/, router/ and the CLI import this package, and it imports none
of them. Only a pull's GGUF conversion (models.convert) loads torch and transformers, lazily.
"""

from models.architectures import SUPPORTED_ARCHITECTURES, family_of
from models.detokenizer import IncrementalDetokenizer
from models.pull import PullError, ensure_model, pull
from models.registry import (
    CACHE_ENV,
    DEFAULT_MODEL,
    MARKER,
    MODEL_CACHE_HELP,
    REGISTRY,
    ModelCache,
    ModelNotPulledError,
    ModelSource,
    ModelSpec,
    cache_path,
    default_cache_dir,
    get_spec,
    is_pulled,
    marker_for,
    read_marker,
    resolve_model,
)
from models.tokenizer import Tokenizer
from models.validate import validate_model_dir

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "MARKER",
    "MODEL_CACHE_HELP",
    "REGISTRY",
    "SUPPORTED_ARCHITECTURES",
    "IncrementalDetokenizer",
    "ModelCache",
    "ModelNotPulledError",
    "ModelSource",
    "ModelSpec",
    "PullError",
    "Tokenizer",
    "cache_path",
    "default_cache_dir",
    "ensure_model",
    "family_of",
    "get_spec",
    "is_pulled",
    "marker_for",
    "pull",
    "read_marker",
    "resolve_model",
    "validate_model_dir",
]
