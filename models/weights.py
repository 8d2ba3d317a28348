"""Which weights a model directory holds: Hugging Face safetensors (one file, or shards an
index names) and a GGUF file (llama.cpp's), which holds every weight by itself."""

from __future__ import annotations

from pathlib import Path

SAFETENSORS_INDEX = "model.safetensors.index.json"


def has_safetensors(model_dir: Path) -> bool:
    """Whether the directory has safetensors weights (an index, or *.safetensors files)."""
    model_dir = Path(model_dir)
    return (model_dir / SAFETENSORS_INDEX).is_file() or any(model_dir.glob("*.safetensors"))


def gguf_files(model_dir: Path) -> list[Path]:
    """The directory's *.gguf files, by name."""
    return sorted(Path(model_dir).glob("*.gguf"))


def gguf_file(model_dir: Path) -> Path | None:
    """The GGUF checkpoint of a model directory: its one ``*.gguf`` file, None if it has
    none; several are refused (which one is meant?)."""
    files = gguf_files(model_dir)
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ValueError(f"{model_dir}: several GGUF files ({names}); keep one")
    return files[0] if files else None
