"""A small, strict parser of the Prometheus text format (0.0.4), enough to
check /metrics: HELP/TYPE lines, samples with labels, histogram invariants."""

import math
import re

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(\{{(.*)\}})?\s+(\S+)(\s+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def _parse_labels(text):
    labels, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ValueError(f"bad labels: {text!r}")
        value = m.group(2).replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        labels[m.group(1)] = value
        pos = m.end()
    return labels


def _value(text):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    return float(text)  # NaN parses too


def parse(text):
    """-> {family: {"type": str, "help": str, "samples": [(name, labels, value)]}}"""
    families, types = {}, {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                fam = families.setdefault(parts[2], {"type": "untyped", "help": "", "samples": []})
                if parts[1] == "TYPE":
                    if parts[2] in types:
                        raise ValueError(f"line {lineno}: second TYPE for {parts[2]}")
                    if len(parts) < 4 or parts[3] not in ("counter", "gauge", "histogram", "summary", "untyped"):
                        raise ValueError(f"line {lineno}: bad TYPE line {line!r}")
                    types[parts[2]] = fam["type"] = parts[3]
                else:
                    fam["help"] = parts[3] if len(parts) > 3 else ""
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"line {lineno}: not a sample: {line!r}")
        name, labels, value = m.group(1), _parse_labels(m.group(3) or ""), _value(m.group(4))
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and types.get(base) == "histogram":
                family = base
        if family not in types:
            raise ValueError(f"line {lineno}: sample {name} has no TYPE line before it")
        families[family]["samples"].append((name, labels, value))
    for fam, info in families.items():
        if info["type"] == "histogram":
            _check_histogram(fam, info["samples"])
    return families


def _check_histogram(fam, samples):
    groups = {}
    for name, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
        g = groups[key]
        if name == fam + "_bucket":
            g["buckets"].append((_value(labels["le"]), value))
        elif name == fam + "_sum":
            g["sum"] = value
        elif name == fam + "_count":
            g["count"] = value
    for key, g in groups.items():
        bounds = [b for b, _ in g["buckets"]]
        counts = [c for _, c in g["buckets"]]
        if not bounds or bounds[-1] != math.inf:
            raise ValueError(f"{fam}{key}: no +Inf bucket")
        if bounds != sorted(bounds) or counts != sorted(counts):
            raise ValueError(f"{fam}{key}: buckets not cumulative")
        if g["count"] is None or g["sum"] is None or counts[-1] != g["count"]:
            raise ValueError(f"{fam}{key}: +Inf bucket != _count or missing _sum")


def value(families, family, name=None, **labels):
    """The one sample of `family` (sample `name`) whose labels include `labels`."""
    found = [v for n, l, v in families[family]["samples"]
             if n == (name or family) and all(l.get(k) == want for k, want in labels.items())]
    if len(found) != 1:
        raise KeyError(f"{family} {labels}: {len(found)} samples")
    return found[0]
