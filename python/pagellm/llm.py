"""LLM: offline batched generation (vLLM's `from vllm import LLM`)."""

from __future__ import annotations

import itertools
import json
import weakref
from typing import Any, Optional, Sequence, Union

from . import _core
from ._engine import (PromptType, Tokenizer, engine_json, make_engine, normalize_prompts, params_list, prompt_ids,
                      render_chat)
from .outputs import (EmbeddingOutput, EmbeddingRequestOutput, RequestOutput, RequestState, ScoringOutput,
                      ScoringRequestOutput)
from .lora.request import LoRARequest
from .sampling_params import SamplingParams

# How long one wait for outputs may hold the thread before Python checks for
# Ctrl-C (the GIL is released while waiting).
_POLL_S = 0.1


class LLM:
    """One model in one engine. `generate` and `chat` run a whole batch of
    prompts through continuous batching and return when all are done. Many
    threads may call one LLM at once: their requests share the engine's steps.

    Engine arguments have vLLM's names: max_model_len, max_num_seqs,
    max_num_batched_tokens, block_size, enable_prefix_caching,
    kv_cache_memory (bytes or "2GiB"), seed, device, num_threads,
    speculative_config, chat_template, ... (docs/embedding.md)."""

    def __init__(self, model: Optional[str] = None, *, tokenizer: Optional[str] = None, **engine_args: Any):
        if tokenizer is not None:
            engine_args["tokenizer"] = tokenizer
        self._engine = make_engine(model, engine_args)
        self._ids = itertools.count()
        self._tokenizer = Tokenizer(self._engine)
        # The engine's step thread must stop before the interpreter exits,
        # even when something (a traceback) still holds this object then.
        self._finalizer = weakref.finalize(self, self._engine.shutdown, 0.0)
        self._loras: dict[str, str] = {}  # adapters loaded so far: name -> path

    # ---- generation

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True, lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None, *,
                 priority: Optional[Sequence[int]] = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in the order of `prompts`. With
        lora_request (one for all prompts, or one per prompt; needs
        LLM(enable_lora=True)), each prompt runs with its adapter, loaded the
        first time it is named; prompts of several adapters share batches."""
        items = normalize_prompts(prompts)
        ids = [prompt_ids(self._engine, p) for p in items]
        return self._run(items, ids, params_list(sampling_params, len(items)), use_tqdm, priority,
                         self._lora_names(lora_request, len(items)))

    def chat(self, messages: Union[list[dict], Sequence[list[dict]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None, use_tqdm: bool = True,
             *, chat_template: Optional[str] = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: Optional[list[dict]] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None,
             lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None) -> list[RequestOutput]:
        """Conversations rendered by the model's chat template (or the engine's
        chat_template argument), then generated like `generate`."""
        if chat_template is not None:
            raise ValueError("a per-call chat_template is not supported: pass chat_template to LLM(...)")
        if not isinstance(messages, (list, tuple)):
            raise TypeError("messages must be a list of message dicts, or a list of such lists")
        conversations = [messages] if not messages or isinstance(messages[0], dict) else list(messages)
        items, ids = [], []
        for k, conv in enumerate(conversations):
            text = render_chat(self._engine, conv, add_generation_prompt=add_generation_prompt,
                               continue_final_message=continue_final_message, tools=tools,
                               chat_template_kwargs=chat_template_kwargs,
                               name="messages" if conv is messages else f"messages[{k}]")
            items.append({"prompt": text})
            ids.append(self._engine.encode(text, False))  # the template wrote the special tokens
        return self._run(items, ids, params_list(sampling_params, len(items)), use_tqdm, None,
                         self._lora_names(lora_request, len(items)))

    def embed(self, prompts: Union[PromptType, Sequence[PromptType]],
              use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """One pooled vector per prompt (`outputs.embedding`), pooled as the
        model says (sentence-transformers files, a GGUF's pooling_type) or as
        the pooling / normalize engine arguments override. Prefill only: the
        prompts run through the same scheduler as generation."""
        items = normalize_prompts(prompts)
        ids = [prompt_ids(self._engine, p) for p in items]
        request_ids = [str(next(self._ids)) for _ in items]
        vectors = self._engine.embed(request_ids, ids) if items else []
        return [EmbeddingRequestOutput(rid, pids, EmbeddingOutput(v))
                for rid, pids, v in zip(request_ids, ids, vectors)]

    def score(self, data_1: Union[str, Sequence[str]], data_2: Union[str, Sequence[str]],
              use_tqdm: bool = True) -> list[ScoringRequestOutput]:
        """Scores of (query, document) pairs with a reranker (a model with a
        score head: `task="score"`), as vLLM's LLM.score pairs them: one text
        against each of a list, or two lists of one length pair by pair. Each
        pair is formatted as the model's score template says and runs prefill
        only through the same scheduler as generation."""
        first = [data_1] if isinstance(data_1, str) else list(data_1)
        second = [data_2] if isinstance(data_2, str) else list(data_2)
        if not all(isinstance(t, str) for t in first + second):
            raise TypeError("score takes texts: a string or a list of strings on each side")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise ValueError(f"data_1 has {len(first)} texts and data_2 {len(second)}: give one, or as many")
        ids = [self._engine.score_prompt(q, d) for q, d in zip(first, second)]
        request_ids = [str(next(self._ids)) for _ in ids]
        scores = self._engine.score(request_ids, ids) if ids else []
        return [ScoringRequestOutput(rid, pids, ScoringOutput(s)) for rid, pids, s in zip(request_ids, ids, scores)]

    # ---- the rest of vLLM's LLM surface

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def get_metrics(self) -> dict[str, Any]:
        """The engine's counters and gauges (requests, tokens, KV usage, speculation)."""
        return json.loads(self._engine.stats_json())

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def __repr__(self) -> str:
        return f"LLM({self._engine.describe()})"

    # ----

    def _lora_names(self, lora_request, count: int) -> list[Optional[str]]:
        if lora_request is None:
            return [None] * count
        reqs = [lora_request] * count if isinstance(lora_request, LoRARequest) else list(lora_request)
        if len(reqs) != count:
            raise ValueError(f"{len(reqs)} LoRA requests for {count} prompts")
        names = []
        for r in reqs:
            if r is None:
                names.append(None)
                continue
            if not isinstance(r, LoRARequest):
                raise TypeError(f"lora_request entries must be LoRARequest, got {type(r).__name__}")
            loaded = self._loras.get(r.lora_name)
            if loaded is None:
                self._engine.load_lora(r.lora_name, r.lora_path)
                self._loras[r.lora_name] = r.lora_path
            elif loaded != r.lora_path:
                raise ValueError(f"LoRA adapter '{r.lora_name}' is loaded from {loaded}, not {r.lora_path}")
            names.append(r.lora_name)
        return names

    def _run(self, items: list[dict], ids: list[list[int]], params: list[SamplingParams], use_tqdm: bool,
             priority: Optional[Sequence[int]], loras: Optional[list[Optional[str]]] = None) -> list[RequestOutput]:
        if not items:
            return []
        if priority is not None and len(priority) != len(items):
            raise ValueError(f"{len(priority)} priorities for {len(items)} prompts")
        request_ids = [str(next(self._ids)) for _ in items]
        states = {}
        for rid, item, pids, sp in zip(request_ids, items, ids, params):
            states[rid] = RequestState(rid, item.get("prompt"), pids, sp.n, sp.logprobs is not None,
                                       sp.prompt_logprobs is not None)
        sink = _core.OutputQueue(self._engine)
        self._engine.submit(request_ids, ids,
                            [engine_json(sp, priority[i] if priority else 0, loras[i] if loras else None)
                             for i, sp in enumerate(params)], sink)
        bar = _progress_bar(len(items)) if use_tqdm else None
        remaining = len(items)
        failed = None
        try:
            while remaining:
                out = sink.next(_POLL_S)
                if out is None:
                    continue
                state = states[out["request_id"]]
                state.add(out)
                if out["finished"]:
                    remaining -= 1
                    if state.error and failed is None:
                        failed = state.error
                    if bar is not None:
                        bar.update(1)
        except BaseException:
            # Ctrl-C (or any error here): stop what is left, so the engine frees it.
            for rid, state in states.items():
                if not state.finished:
                    self._engine.abort(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        if failed is not None:
            raise RuntimeError(f"generation failed: {failed}")
        return [states[rid].output() for rid in request_ids]


def _progress_bar(total: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the progress bar is a nicety
        return None
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
