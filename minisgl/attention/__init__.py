from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from minisgl.utils import Registry, init_logger

from .base import BaseAttnBackend, BaseAttnMetadata, HybridBackend

if TYPE_CHECKING:
    from minisgl.models import ModelConfig

logger = init_logger(__name__)


class BackendCreator(Protocol):
    def __call__(self, config: ModelConfig) -> BaseAttnBackend: ...


SUPPORTED_ATTENTION_BACKENDS = Registry[BackendCreator]("Attention Backend")


@SUPPORTED_ATTENTION_BACKENDS.register("torch")
def create_torch_backend(config: ModelConfig) -> BaseAttnBackend:
    from .native import TorchNativeBackend

    return TorchNativeBackend(config)


@SUPPORTED_ATTENTION_BACKENDS.register("fi")
def create_fi_backend(config: ModelConfig) -> BaseAttnBackend:
    from .fi import FlashInferBackend

    return FlashInferBackend(config)


@SUPPORTED_ATTENTION_BACKENDS.register("fa")
def create_fa_backend(config: ModelConfig) -> BaseAttnBackend:
    from .fa import FlashAttentionBackend

    return FlashAttentionBackend(config)


def validate_attn_backend(backend: str, allow_auto: bool = True) -> str:
    """Check a backend spec: "name", "prefill_name,decode_name", or "auto"."""
    if backend == "auto":
        assert allow_auto, "'auto' must be resolved before a backend is created"
        return backend
    SUPPORTED_ATTENTION_BACKENDS.assert_supported(backend.split(","))
    return backend


def create_attention_backend(backend: str, config: ModelConfig) -> BaseAttnBackend:
    validate_attn_backend(backend, allow_auto=False)
    if "," in backend:
        assert backend.count(",") == 1, "a hybrid backend names exactly two backends"
        prefill, decode = backend.split(",")
        if prefill != decode:
            logger.info(f"hybrid attention backend: prefill={prefill}, decode={decode}")
            return HybridBackend(
                create_attention_backend(prefill, config), create_attention_backend(decode, config)
            )
        logger.warning(f"prefill and decode backends are both {prefill}: using one backend")
        backend = prefill
    return SUPPORTED_ATTENTION_BACKENDS[backend](config)


__all__ = [
    "BaseAttnMetadata",
    "BaseAttnBackend",
    "HybridBackend",
    "create_attention_backend",
    "SUPPORTED_ATTENTION_BACKENDS",
    "validate_attn_backend",
]
