"""pagellm: an LLM inference engine with a paged KV cache, embedded in Python.

    from pagellm import LLM, SamplingParams
    llm = LLM()  # the default model (Gemma 3 270M), or LLM(model="path/to/model.gguf")
    outputs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(outputs[0].outputs[0].text)

The API follows vLLM's: LLM, SamplingParams, RequestOutput, CompletionOutput,
AsyncLLM (AsyncLLMEngine) and AsyncEngineArgs."""

from ._core import __version__
from .async_llm import AsyncEngineArgs, AsyncLLM, AsyncLLMEngine, EngineArgs
from .llm import LLM
from .lora.request import LoRARequest
from .outputs import (CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, Logprob, RequestMetrics,
                      RequestOutput, ScoringOutput, ScoringRequestOutput)
from .sampling_params import GuidedDecodingParams, RequestOutputKind, SamplingParams, StructuredOutputsParams
from ._engine import Tokenizer

__all__ = [
    "AsyncEngineArgs", "AsyncLLM", "AsyncLLMEngine", "CompletionOutput", "EmbeddingOutput", "EmbeddingRequestOutput", "EngineArgs", "GuidedDecodingParams", "LLM", "LoRARequest",
    "Logprob", "RequestMetrics", "RequestOutput", "RequestOutputKind", "SamplingParams", "ScoringOutput",
    "ScoringRequestOutput", "StructuredOutputsParams",
    "Tokenizer", "__version__",
]
