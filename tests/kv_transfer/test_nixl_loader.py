"""NIXL is loaded for torch's CUDA major version, and a wheel for another CUDA is refused
with both versions named."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kv_transfer import TransportUnavailable, nixl_loader
from kv_transfer.nixl_loader import check_cuda_match, nixl_modules

MODULES = ("nixl_cu12._api", "nixl._api", "nixl_cu13._api")


@pytest.mark.parametrize(
    ("torch_cuda", "first"),
    [("13.0", "nixl_cu13._api"), ("12.8", "nixl_cu12._api"), (None, "nixl_cu12._api")],
)
def test_the_wheel_for_torchs_cuda_is_tried_first(torch_cuda: str | None, first: str) -> None:
    order = nixl_modules(torch_cuda, MODULES)
    assert order[0] == first and sorted(order) == sorted(MODULES)


@pytest.mark.parametrize(
    ("module", "torch_cuda"),
    [("nixl_cu12._api", "12.8"), ("nixl_cu13._api", "13.0"), ("nixl_cu12._api", None),
     ("nixl._api", "13.0")],
)  # fmt: skip
def test_matching_or_unknown_versions_pass(module: str, torch_cuda: str | None) -> None:
    check_cuda_match(module, torch_cuda, "2.13.0")


def test_a_mismatch_names_both_versions_and_the_fix() -> None:
    with pytest.raises(TransportUnavailable) as err:
        check_cuda_match("nixl_cu12._api", "13.0", "2.11.0+cu130")
    message = str(err.value)
    for part in ("nixl-cu12", "CUDA 12", "torch 2.11.0+cu130", "CUDA 13.0", "splitserve[cuda13]"):
        assert part in message, message


@pytest.mark.skipif(importlib.util.find_spec("nixl_cu12") is None, reason="needs nixl-cu12")
def test_load_refuses_the_installed_wheel_under_a_cuda_13_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nixl_loader, "_MODULES", ("nixl_cu12._api",))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(TransportUnavailable, match="nixl-cu12, built for CUDA 12"):
        nixl_loader.load_nixl()
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU torch takes it
    assert nixl_loader.load_nixl().__name__ == "nixl_cu12._api"
