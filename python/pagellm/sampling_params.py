"""SamplingParams with vLLM's field names and defaults.

Floats must be finite and strings valid Unicode text: a NaN, an infinity or
a lone surrogate raises ValueError naming the field, when SamplingParams is
made and again when a request is submitted (fields may change in between).
The engine checks the ranges when a request is submitted: a value out of
range raises ValueError there, with the engine's message naming the field."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from ._checks import check_values


class RequestOutputKind(enum.Enum):
    """What each streamed RequestOutput holds (vLLM's names)."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class StructuredOutputsParams:
    """Constrained decoding: set exactly one of json, regex, choice, grammar,
    json_object, structural_tag (vLLM's StructuredOutputsParams)."""

    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[Union[str, dict]] = None
    disable_any_whitespace: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if not out.get("disable_any_whitespace"):
            out.pop("disable_any_whitespace", None)
        return out


# vLLM's older name for the same thing.
GuidedDecodingParams = StructuredOutputsParams


@dataclass
class SamplingParams:
    """How one prompt is sampled and when it stops (vLLM's SamplingParams)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16  # None: all the room the context has left
    min_tokens: int = 0
    logprobs: Optional[int] = None  # the chosen token's logprob plus this many top ones
    prompt_logprobs: Optional[int] = None  # each prompt token's logprob plus this many top ones
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: Optional[dict[int, float]] = None
    structured_outputs: Optional[StructuredOutputsParams] = None
    guided_decoding: Optional[StructuredOutputsParams] = None  # vLLM's older name
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: Optional[dict[str, Any]] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.structured_outputs is not None and self.guided_decoding is not None:
            raise ValueError("give structured_outputs or guided_decoding, not both")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        self._check_values()

    def _check_values(self) -> None:
        """ValueError naming the field for a float that is not finite or a
        string that is not valid text (extra_args stays in Python: unchecked)."""
        for f in fields(self):
            if f.name in ("extra_args", "output_kind"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, StructuredOutputsParams):
                for g in fields(value):
                    check_values(getattr(value, g.name), f"{f.name}.{g.name}")
            else:
                check_values(value, f.name)

    def clone(self) -> "SamplingParams":
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(self)})

    def to_engine_dict(self) -> dict[str, Any]:
        """The engine's JSON object (the same names as the HTTP API)."""
        self._check_values()
        out: dict[str, Any] = {
            "n": self.n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "ignore_eos": self.ignore_eos,
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
        }
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.prompt_logprobs is not None:
            out["prompt_logprobs"] = self.prompt_logprobs
        if self.logit_bias:
            out["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        so = self.structured_outputs or self.guided_decoding
        if so is not None:
            out["structured_outputs"] = so.to_dict() if isinstance(so, StructuredOutputsParams) else dict(so)
        return out
