"""What LLM and AsyncLLM share: engine arguments, prompts, the tokenizer."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence, Union

from . import _core
from ._checks import check_text, check_values
from .sampling_params import SamplingParams

PromptType = Union[str, dict]


def make_engine(model: Optional[str], engine_args: dict[str, Any]) -> "_core.Engine":
    """The native engine from vLLM-named engine arguments (ValueError for bad ones)."""
    args = {k: v for k, v in engine_args.items() if v is not None}
    if model is not None:
        args["model"] = os.fspath(model)
    if isinstance(args.get("chat_template"), os.PathLike):
        args["chat_template"] = os.fspath(args["chat_template"])
    for name, value in args.items():
        check_text(name, "an engine argument's name")
        check_values(value, name)
    if isinstance(args.get("speculative_config"), dict):
        args["speculative_config"] = json.dumps(args["speculative_config"], allow_nan=False)
    try:
        text = json.dumps(args, allow_nan=False)
    except TypeError as e:
        raise ValueError(f"engine arguments must be JSON values: {e}") from None
    return _core.Engine(text)


def normalize_prompts(prompts: Union[PromptType, Sequence[PromptType]]) -> list[dict]:
    """A prompt, or a list of them: text, {"prompt": text} or {"prompt_token_ids": [...]}."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string, a dict or a list of them, got {type(prompts).__name__}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            check_text(p, f"prompt {i}")
            out.append({"prompt": p})
        elif isinstance(p, dict):
            if "prompt_token_ids" not in p and "prompt" not in p:
                raise ValueError(f"prompt {i}: a dict prompt needs 'prompt' or 'prompt_token_ids'")
            if "prompt_token_ids" not in p and isinstance(p["prompt"], str):
                check_text(p["prompt"], f"prompt {i}")
            out.append(p)
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
            raise TypeError(f"prompt {i} is a list of ints: pass token ids as {{'prompt_token_ids': [...]}}")
        else:
            raise TypeError(f"prompt {i} must be a string or a dict, got {type(p).__name__}")
    return out


def prompt_ids(engine: "_core.Engine", p: dict) -> list[int]:
    if "prompt_token_ids" in p:
        ids = p["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) for t in ids):
            raise ValueError("prompt_token_ids must be a list of ints")
        return list(ids)
    if not isinstance(p["prompt"], str):
        raise TypeError(f"'prompt' must be a string, got {type(p['prompt']).__name__}")
    return engine.encode(p["prompt"], True)


def params_list(sampling_params, count: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    if isinstance(sampling_params, (list, tuple)):
        if len(sampling_params) != count:
            raise ValueError(f"{len(sampling_params)} sampling params for {count} prompts: give one, or one per prompt")
        for sp in sampling_params:
            if not isinstance(sp, SamplingParams):
                raise TypeError(f"sampling_params entries must be SamplingParams, got {type(sp).__name__}")
        return list(sampling_params)
    raise TypeError(f"sampling_params must be SamplingParams or a list of them, got {type(sampling_params).__name__}")


def engine_json(sp: SamplingParams, priority: int = 0, lora: Optional[str] = None) -> str:
    d = sp.to_engine_dict()  # checks sp's values
    if priority:
        check_values(priority, "priority")
        d["priority"] = priority
    if lora:
        d["lora"] = lora
    return json.dumps(d, allow_nan=False)


class Tokenizer:
    """The model's tokenizer (llm.get_tokenizer()), with the calls most code uses
    from a Hugging Face tokenizer."""

    def __init__(self, engine: "_core.Engine"):
        self._engine = engine

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if isinstance(text, str):
            check_text(text, "text")
        return self._engine.encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._engine.token_text(i) for i in ids]

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True, add_generation_prompt: bool = False,
                            tools: Optional[list] = None, **kwargs):
        text = render_chat(self._engine, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           chat_template_kwargs=kwargs or None)
        return self._engine.encode(text, False) if tokenize else text

    @property
    def eos_token_id(self) -> Optional[int]:
        i = self._engine.eos_token_id
        return None if i < 0 else i

    @property
    def bos_token_id(self) -> Optional[int]:
        i = self._engine.bos_token_id
        return None if i < 0 else i

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    def __len__(self) -> int:
        return self._engine.vocab_size


def render_chat(engine: "_core.Engine", messages: list[dict], *, add_generation_prompt: bool = True,
                continue_final_message: bool = False, tools: Optional[list] = None,
                chat_template_kwargs: Optional[dict] = None, name: str = "messages") -> str:
    """`name`: what errors call `messages` (messages[2] for the third of many conversations)."""
    check_values(messages, name)
    options: dict[str, Any] = {"add_generation_prompt": add_generation_prompt,
                               "continue_final_message": continue_final_message}
    if tools is not None:
        options["tools"] = tools
    if chat_template_kwargs:
        options["chat_template_kwargs"] = chat_template_kwargs
    for key in ("tools", "chat_template_kwargs"):
        check_values(options.get(key), key)
    return engine.render_chat(json.dumps(messages, allow_nan=False), json.dumps(options, allow_nan=False))
