"""Checks of the values that cross into the native engine.

Values go down as JSON text or as C++ strings. JSON has no NaN or infinity,
and a string holding a lone surrogate ("\\ud800") has no UTF-8 form, so
without these checks such a value fails on the native side with a JSON parse
error or "incompatible function arguments", naming no field. Here it is a
ValueError naming the field instead."""

from __future__ import annotations

import math
from typing import Any


def check_text(value: str, name: str) -> None:
    """ValueError naming `name` when `value` cannot be encoded as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} must be valid Unicode text: the lone surrogate U+{ord(value[e.start]):04X} at "
                         f"index {e.start} has no UTF-8 form") from None


def check_values(value: Any, name: str) -> None:
    """Walks a value bound for the engine's JSON (dicts, lists and tuples
    inside): every float must be finite and every string, dict keys
    included, valid text. Nested names read like Python: logit_bias[5],
    messages[0]['content']."""
    _walk(value, name, set())


def _walk(value: Any, name: str, path: set[int]) -> None:
    if isinstance(value, float):  # bool and int are never NaN
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    elif isinstance(value, str):
        check_text(value, name)
    elif isinstance(value, (dict, list, tuple)):
        if id(value) in path:  # a cycle: json.dumps reports it
            return
        path.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str):
                    check_text(k, f"a key of {name}")
                _walk(v, f"{name}[{k!r}]", path)
        else:
            for i, v in enumerate(value):
                _walk(v, f"{name}[{i}]", path)
        path.discard(id(value))
