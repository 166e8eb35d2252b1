"""What generation returns, with vLLM's class and attribute names.

The engine's outputs come as plain dicts already rendered on the C++ side
(src/api/output_render.h: finish and stop reasons, logprobs with decoded
tokens and ranks), the same facts the OpenAI server shows. This module only
puts them together per request and wraps them in vLLM's classes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Union


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None  # 1: the most likely token
    decoded_token: Optional[str] = None


# One dict per generated token: token id -> Logprob (the chosen token and the top ones).
SampleLogprobs = list[dict[int, Logprob]]
# One per prompt token, None for the first (nothing comes before it).
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None  # "stop", "length" or "abort"; None while running
    stop_reason: Union[int, str, None] = None  # the stop string or token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    time_in_queue: Optional[float] = None  # seconds from arrival to first scheduled
    first_token_latency: Optional[float] = None  # seconds from arrival to the first token
    num_generation_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    prompt_logprobs: Optional[PromptLogprobs] = None  # with SamplingParams.prompt_logprobs


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """LLM.embed's result per prompt (vLLM's shape): the vector is `outputs.embedding`."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """LLM.score's result per pair (vLLM's shape): the score is `outputs.score`."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True


@dataclass
class _Sample:
    text: str = ""
    token_ids: list = field(default_factory=list)
    logprobs: Optional[list] = None
    cumulative_logprob: Optional[float] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    sent_text: int = 0  # what DELTA outputs have already handed out
    sent_tokens: int = 0


class RequestState:
    """Accumulates one request's outputs (the engine sends deltas) into
    RequestOutput objects, cumulative or as deltas."""

    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: list[int], n: int,
                 want_logprobs: bool, want_prompt_logprobs: bool = False):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.samples = [_Sample(logprobs=[] if want_logprobs else None,
                                cumulative_logprob=0.0 if want_logprobs else None) for _ in range(n)]
        self.finished = False
        self.error: Optional[str] = None
        self.num_cached_tokens = 0
        # (A one-token prompt has nothing to score: the engine sends none.)
        self.prompt_logprobs: Optional[list] = [None] if want_prompt_logprobs and len(prompt_token_ids) == 1 else None
        self.metrics = RequestMetrics(arrival_time=time.time())

    def add(self, out: dict) -> None:
        now = time.time()
        self.num_cached_tokens = out["num_cached_tokens"]
        if out.get("prompt_logprobs") is not None:
            self.prompt_logprobs = [None] + [{tid: Logprob(*fields) for tid, fields in position.items()}
                                             for position in out["prompt_logprobs"]]
        for c in out["completions"]:
            s = self.samples[c["index"]]
            s.text += c["text"]
            s.token_ids.extend(c["token_ids"])
            if c["token_ids"] and self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            if c["logprobs"] is not None and s.logprobs is not None:
                s.logprobs.extend({tid: Logprob(*fields) for tid, fields in position.items()}
                                  for position in c["logprobs"])
                s.cumulative_logprob += c["logprob_sum"]
            if c["finish_reason"] is not None:
                s.finish_reason = c["finish_reason"]
                s.stop_reason = c["stop_reason"]
        if out["finished"]:
            self.finished = True
            self.error = out["error"]
            self.metrics.finished_time = now
            self.metrics.time_in_queue = out["queue_s"]
            self.metrics.first_token_latency = out["ttft_s"]
        self.metrics.num_generation_tokens = sum(len(s.token_ids) for s in self.samples)

    def output(self, delta: bool = False) -> RequestOutput:
        outs = []
        for i, s in enumerate(self.samples):
            if delta:
                text, ids = s.text[s.sent_text:], s.token_ids[s.sent_tokens:]
                lps = s.logprobs[s.sent_tokens:] if s.logprobs is not None else None
                s.sent_text, s.sent_tokens = len(s.text), len(s.token_ids)
            else:
                text, ids = s.text, list(s.token_ids)
                lps = list(s.logprobs) if s.logprobs is not None else None
            outs.append(CompletionOutput(i, text, ids, s.cumulative_logprob, lps, s.finish_reason, s.stop_reason))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, self.finished,
                             self.metrics, self.num_cached_tokens, self.prompt_logprobs)
