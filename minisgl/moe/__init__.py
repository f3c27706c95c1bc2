"""Mixture-of-experts backends, by name: "torch" (a loop over the experts, the reference) and
"fused" (Triton kernels: tokens sorted by expert, one grouped matrix product per projection)."""

from __future__ import annotations

from typing import Protocol

from minisgl.utils import Registry

from .base import BaseMoeBackend


class MoeBackendCreator(Protocol):
    def __call__(self) -> BaseMoeBackend: ...


SUPPORTED_MOE_BACKENDS = Registry[MoeBackendCreator]("MoE Backend")


@SUPPORTED_MOE_BACKENDS.register("torch")
def create_torch_moe_backend() -> BaseMoeBackend:
    from .native import TorchMoe

    return TorchMoe()


@SUPPORTED_MOE_BACKENDS.register("fused")
def create_fused_moe_backend() -> BaseMoeBackend:
    from .fused import FusedMoe

    return FusedMoe()


def create_moe_backend(backend: str) -> BaseMoeBackend:
    return SUPPORTED_MOE_BACKENDS[backend]()


__all__ = ["BaseMoeBackend", "create_moe_backend", "SUPPORTED_MOE_BACKENDS"]
