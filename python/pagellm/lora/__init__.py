"""LoRA adapters (vLLM's `vllm.lora`): `from pagellm.lora.request import LoRARequest`."""

from .request import LoRARequest

__all__ = ["LoRARequest"]
