"""The LoRA adapters the router serves: name -> PEFT directory, from ``--lora-modules`` and
POST /v1/load_lora_adapter. A request's ``model`` names the base model or one of them; the
adapter's path travels with the request, so a node that lacks it loads it on first use."""

from __future__ import annotations

from cluster.protocol import AdapterRef
from models.lora_modules import lora_module_map
from router.errors import APIError


class RouterAdapters:
    """Adapter name -> path, in the order they were added."""

    def __init__(self, modules: list[str]) -> None:
        self._paths: dict[str, str] = lora_module_map(modules)

    def items(self) -> list[tuple[str, str]]:
        return list(self._paths.items())

    def add(self, name: str, path: str) -> None:
        self._paths[name] = path

    def remove(self, name: str) -> bool:
        return self._paths.pop(name, None) is not None

    def resolve(self, model: str, base: str) -> AdapterRef | None:
        """The adapter `model` names (None: the base model); 404 in the OpenAI format when
        it names neither."""
        if model == base:
            return None
        path = self._paths.get(model)
        if path is None:
            served = ", ".join(f"'{n}'" for n in [base, *self._paths])
            raise APIError(
                404,
                f"the model '{model}' does not exist; this router serves {served}",
                param="model",
                code="model_not_found",
            )
        return AdapterRef(name=model, path=path)
