"""Device slots: every loaded adapter's matrices stacked per fused matrix of every layer.

A fused matrix (``qkv``, ``o_proj``, ``gate_up``, ``down``) gets ``a`` [slots, subs * rank,
in] and ``b`` [slots, out, rank] (for the C kernel a view of ``bt`` [slots, rank, out], so its
expand runs along output columns): sub-matrix i (q, k, v; gate, up) owns rows
``i * rank .. (i + 1) * rank`` of ``a`` and the columns ``ends[i - 1] .. ends[i]`` of the fused
output, so its delta lands where its base projection does. Smaller ranks and modules an
adapter leaves out are zeros; ``targeted`` says which slots hold any weight for a matrix, so a
step whose adapters leave a matrix out skips it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cpu_kernels.lora import CpuMatrix
from engine.lora.adapter import LoraAdapter, LoraLoadError
from engine.model.config import ModelConfig

RANK_MULTIPLE = 8  # slot ranks are padded to it (the C kernel's vector width)


@dataclass(frozen=True)
class MatrixLayout:
    """The checkpoint modules a fused matrix is made of, in column order."""

    modules: tuple[str, ...]
    ends: tuple[int, ...]  # column end of each module in the fused output
    in_features: int


def layer_layouts(config: ModelConfig, index: int) -> dict[str, MatrixLayout]:
    """Fused matrix name (as ``Packed.project`` names it) -> its layout, for layer `index`."""
    q, kv, hidden, inter = (
        config.q_size, config.kv_size, config.hidden_size, config.intermediate_size,
    )  # fmt: skip
    layouts = {
        "qkv": MatrixLayout(("q_proj", "k_proj", "v_proj"), (q, q + kv, q + 2 * kv), hidden),
        "o_proj": MatrixLayout(("o_proj",), (hidden,), q),
    }
    if config.moe is None or not config.is_moe_layer(index):
        layouts["gate_up"] = MatrixLayout(("gate_proj", "up_proj"), (inter, 2 * inter), hidden)
        layouts["down"] = MatrixLayout(("down_proj",), (hidden,), inter)
    return layouts


class MatrixSlots:
    """One fused matrix of one layer, for every slot."""

    def __init__(
        self,
        layout: MatrixLayout,
        num_slots: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
        cpu_kernel: bool = False,
    ) -> None:
        self.layout = layout
        self.rank = rank
        subs, out = len(layout.modules), layout.ends[-1]
        self.a = torch.zeros(num_slots, subs * rank, layout.in_features, dtype=dtype, device=device)
        self.cpu: CpuMatrix | None = None
        if cpu_kernel:
            bt = torch.zeros(num_slots, rank, out, dtype=dtype, device=device)
            self.b = bt.transpose(1, 2)  # [slots, out, rank], a view
            self.cpu = CpuMatrix(self.a, bt, layout.ends)
        else:
            self.b = torch.zeros(num_slots, out, rank, dtype=dtype, device=device)
        self.targeted = [False] * num_slots

    def fill(self, slot: int, layer: int, adapter: LoraAdapter) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.targeted[slot] = False
        start = 0
        for i, (module, end) in enumerate(zip(self.layout.modules, self.layout.ends, strict=True)):
            pair = adapter.weights.get((layer, module))
            if pair is not None:
                a, b = pair
                r = a.shape[0]
                self.a[slot, i * self.rank : i * self.rank + r].copy_(a)
                self.b[slot, start:end, :r].copy_(b)
                self.targeted[slot] = True
            start = end


class LoraSlots:
    """The slots of every layer; ``fill`` loads an adapter into one."""

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        cpu_kernel: bool = False,
    ) -> None:
        """``cpu_kernel``: lay the matrices out for ``engine.cpu_kernels.lora``."""
        self.num_slots = num_slots
        self.rank = -(-max_rank // RANK_MULTIPLE) * RANK_MULTIPLE
        self.layers = [
            {
                name: MatrixSlots(layout, num_slots, self.rank, dtype, device, cpu_kernel)
                for name, layout in layer_layouts(config, i).items()
            }
            for i in range(config.num_hidden_layers)
        ]
        self.max_rows = max(m.a.shape[1] for layer in self.layers for m in layer.values())

    def check(self, adapter: LoraAdapter) -> None:
        """LoraLoadError naming the adapter's file when its matrices do not fit the model."""
        where = adapter.path / "adapter_model.safetensors"
        for (layer, module), (a, b) in adapter.weights.items():
            if layer >= len(self.layers):
                raise LoraLoadError(f"{where}: layer {layer}, the model has {len(self.layers)}")
            found = [
                (m, lay) for m, lay in self.layers[layer].items() if module in lay.layout.modules
            ]
            if not found:
                raise LoraLoadError(f"{where}: layer {layer} has no {module} (a sparse layer)")
            layout = found[0][1].layout
            i = layout.modules.index(module)
            out = layout.ends[i] - (layout.ends[i - 1] if i else 0)
            if a.shape[1] != layout.in_features or b.shape[0] != out:
                raise LoraLoadError(
                    f"{where}: layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B "
                    f"{tuple(b.shape)} do not fit the model's [{out}, {layout.in_features}]"
                )

    def fill(self, slot: int, adapter: LoraAdapter) -> None:
        for index, matrices in enumerate(self.layers):
            for matrix in matrices.values():
                matrix.fill(slot, index, adapter)
