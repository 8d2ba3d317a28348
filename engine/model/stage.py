"""A pipeline stage's share of the model: a contiguous range of decoder layers, the
embedding on the first stage, the final norm and the LM head on the last.

``Stage.whole(n)`` is the whole model on one stage. The layers are split as evenly as they
go (``[s n / P, (s + 1) n / P)``); a stage holds the KV cache of its layers only. With tied
embeddings the last stage holds a copy of the embedding table as its head. The activations
between stages are sent by ``engine.parallel.pipeline``; the layers only read the range.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from engine.model.shard import Span

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Stage:
    index: int
    size: int
    layers: Span  # the model's layer indices this stage holds

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.size:
            raise ValueError(f"pipeline stage {self.index} is not in [0, {self.size})")

    @classmethod
    def of(cls, num_layers: int, index: int, size: int) -> Stage:
        """Stage ``index`` of ``size`` over a model of ``num_layers`` layers; ValueError when
        there are fewer layers than stages."""
        if num_layers < size:
            raise ValueError(
                f"pipeline_parallel_size ({size}) is above the model's {num_layers} layers"
            )
        start = index * num_layers // size
        return cls(index, size, Span(start, (index + 1) * num_layers // size - start))

    @classmethod
    def whole(cls, num_layers: int) -> Stage:
        return cls(0, 1, Span(0, num_layers))

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    def has_embedding(self, tied: bool) -> bool:
        """The table is here: to embed (first stage), or as the tied head (last)."""
        return self.first or (self.last and tied)

    def holds(self, name: str, tied: bool) -> bool:
        """Whether checkpoint tensor ``name`` has a place on this stage (the loader reads
        no other)."""
        match = _LAYER.search(name)
        if match is not None:
            return self.layers.start <= int(match.group(1)) < self.layers.stop
        if name.endswith("embed_tokens.weight"):
            return self.has_embedding(tied)
        if name.endswith(("lm_head.weight", "norm.weight")):
            return self.last
        return True


def stage_config(config: Any, stage: Stage) -> Any:
    """The ModelConfig of the stage's KV cache: its layers' count and windows."""
    if stage.size == 1:
        return config
    span = slice(stage.layers.start, stage.layers.stop)
    return dataclasses.replace(
        config, num_hidden_layers=stage.layers.length, layer_windows=config.layer_windows[span]
    )
