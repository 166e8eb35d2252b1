"""LoRARequest: which adapter a request runs with (vLLM's shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, with where to read it from (a PEFT folder or a GGUF
    LoRA file). The engine (LLM(enable_lora=True, max_loras=..., ...)) loads
    it the first time a request names it; lora_int_id is kept for vLLM's
    signature (names identify adapters here)."""

    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""
    base_model_name: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError("lora_path must be a non-empty string (a PEFT folder or a GGUF LoRA file)")
