#!/usr/bin/env python3
"""Checks the deployment files in deploy/ (run by `make deploy-check`, part of `make test`).

1. yamllint on every YAML file under deploy/.
2. Every Kubernetes manifest in deploy/kubernetes against the Kubernetes API's
   models (the official `kubernetes` Python client): each object is
   deserialized into its model class, which rejects missing required fields
   and wrongly typed values, and serialized back; a field that does not
   survive the round trip is not part of the API (a misspelling, a wrong
   level).
3. What pagellm needs of them: probes on /health, a grace period longer than
   --shutdown-timeout, a memory request that covers --kv-cache-memory and the
   weights, a preStop sleep, Prometheus scrape annotations, an autoscaler
   on num_requests_waiting with an adapter rule that serves it, a Service
   that selects the Deployment's pods.
4. With --build and a container runtime that answers (docker or podman):
   builds the image (its last stage checks that the binary starts).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes.client as k8s
import yaml
from yamllint import config as yl_config
from yamllint import linter

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
MODELS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
}
LINT = yl_config.YamlLintConfig("extends: default\nrules: {line-length: {max: 120}, document-start: disable}")
WEIGHTS_AND_ACTIVATIONS = 512 << 20  # the default model's weights (~240 MiB) and a margin

errors = []


def error(where, message):
    errors.append(f"{where}: {message}")


def lint():
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for problem in linter.run(path.read_text(), LINT, str(path)):
            error(path.name, f"line {problem.line}: {problem.message} ({problem.rule})")


def lost_fields(original, round_trip, path=""):
    """Keys of `original` that the model's serialization does not give back."""
    if isinstance(original, dict):
        if not isinstance(round_trip, dict):
            return [path or "/"]
        out = []
        for key, value in original.items():
            if key not in round_trip:
                out.append(f"{path}.{key}")
            else:
                out += lost_fields(value, round_trip[key], f"{path}.{key}")
        return out
    if isinstance(original, list):
        if not isinstance(round_trip, list) or len(round_trip) != len(original):
            return [path]
        return [p for i, v in enumerate(original) for p in lost_fields(v, round_trip[i], f"{path}[{i}]")]
    return [] if str(original) == str(round_trip) else [f"{path} ({original!r} became {round_trip!r})"]


def load_manifests():
    api = k8s.ApiClient()
    objects = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        where = f"{path.parent.name}/{path.name}"
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key[1] == "Kustomization":
                for res in doc.get("resources", []):
                    if not (path.parent / res).exists():
                        error(where, f"resource {res} does not exist")
                continue
            if key not in MODELS:
                error(where, f"no schema for {key[0]} {key[1]}")
                continue
            try:
                model = api.deserialize(json.dumps(doc), MODELS[key], "application/json")
            except (ValueError, TypeError) as e:
                error(where, f"{key[1]} does not match the Kubernetes API: {e}")
                continue
            for field in lost_fields(doc, api.sanitize_for_serialization(model)):
                error(where, f"{key[1]} field {field} is not in the Kubernetes API")
            objects.append((where, doc))
    return objects


def quantity_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    if not m or m.group(2) not in units and m.group(2):
        raise ValueError(f"unknown quantity {q}")
    return float(m.group(1)) * units.get(m.group(2), 1)


def arg(args, name):
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_pagellm(objects):
    by_kind = {doc["kind"]: (where, doc) for where, doc in objects}
    if "Deployment" not in by_kind:
        error("deploy/kubernetes", "no Deployment")
        return
    where, dep = by_kind["Deployment"]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        if container.get(probe, {}).get("httpGet", {}).get("path") != "/health":
            error(where, f"{probe} must GET /health")
    args = container.get("args", [])
    shutdown = float(arg(args, "--shutdown-timeout") or 30)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    delay = 0.0
    if pre_stop[:1] == ["sleep"] and len(pre_stop) == 2 and re.fullmatch(r"[0-9.]+", pre_stop[1]):
        delay = float(pre_stop[1])
    if not pre_stop:
        error(where, "add a preStop sleep, so the Service stops routing to a pod before it is stopped")
    if grace <= shutdown + delay:
        error(where, f"terminationGracePeriodSeconds {grace} must exceed --shutdown-timeout {shutdown}"
                     f" plus the preStop sleep {delay}")
    kv = arg(args, "--kv-cache-memory")
    if kv is None:
        error(where, "pass --kv-cache-memory, so the memory request can be sized from it")
    else:
        need = quantity_bytes(kv.replace("iB", "i")) + WEIGHTS_AND_ACTIVATIONS
        have = quantity_bytes(container.get("resources", {}).get("requests", {}).get("memory", "0"))
        if have < need:
            error(where, f"memory request {have / (1 << 30):.2f} GiB is below --kv-cache-memory + weights "
                         f"({need / (1 << 30):.2f} GiB)")
    notes = pod.get("metadata", {}).get("annotations", {})
    if notes.get("prometheus.io/scrape") != "true" or notes.get("prometheus.io/path") != "/metrics":
        error(where, "pod template needs prometheus.io/scrape and prometheus.io/path annotations")
    labels = pod["metadata"].get("labels", {})
    if "Service" in by_kind:
        swhere, svc = by_kind["Service"]
        if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
            error(swhere, "the Service's selector does not match the Deployment's pods")
    else:
        error("deploy/kubernetes", "no Service")
    if "HorizontalPodAutoscaler" in by_kind:
        hwhere, hpa = by_kind["HorizontalPodAutoscaler"]
        names = [m.get("pods", {}).get("metric", {}).get("name", "") for m in hpa["spec"].get("metrics", [])]
        if not any("num_requests_waiting" in n for n in names):
            error(hwhere, "the autoscaler should scale on num_requests_waiting")
        if hpa["spec"]["scaleTargetRef"]["name"] != dep["metadata"]["name"]:
            error(hwhere, "the autoscaler targets another Deployment")
        check_adapter_rule(hwhere, names)
    else:
        error("deploy/kubernetes", "no HorizontalPodAutoscaler")


def check_adapter_rule(hwhere, names):
    """The autoscaler's Pods metric exists only if the metrics adapter serves it."""
    path = DEPLOY / "prometheus-adapter-values.yaml"
    if not path.exists():
        error(hwhere, "no deploy/prometheus-adapter-values.yaml serves the autoscaler's metric")
        return
    rules = (yaml.safe_load(path.read_text()) or {}).get("rules", {}).get("custom", [])
    served = {r.get("name", {}).get("as"): r.get("seriesQuery", "") for r in rules}
    for name in names:
        if name not in served:
            error(path.name, f"no rule serves the autoscaler's metric {name}")
        elif "pagellm:num_requests_waiting" not in served[name]:
            error(path.name, f"the rule for {name} does not read pagellm:num_requests_waiting")


def container_runtime():
    """docker or podman, if one answers: a docker client without a daemon is no runtime."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        try:
            if path and subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
                return path
        except subprocess.TimeoutExpired:
            pass
    return None


def build_image():
    runtime = container_runtime()
    if runtime is None:
        print("validate_deploy: no container runtime answers here; the image is not built")
        return
    # e.g. PAGELLM_IMAGE_BUILD_FLAGS=--isolation=chroot for podman inside a container
    flags = shlex.split(os.environ.get("PAGELLM_IMAGE_BUILD_FLAGS", ""))
    p = subprocess.run([runtime, "build", *flags, "-t", "pagellm:ci", str(REPO)], capture_output=True, text=True)
    if p.returncode != 0:
        error("Dockerfile", f"{runtime} build failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")


def main():
    global DEPLOY
    if "--dir" in sys.argv:  # another deploy/ folder (the tests' broken copies)
        DEPLOY = Path(sys.argv[sys.argv.index("--dir") + 1]).resolve()
    lint()
    objects = load_manifests()
    check_pagellm(objects)
    if "--build" in sys.argv[1:]:
        build_image()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print(f"validate_deploy: {len(objects)} Kubernetes objects and the YAML under deploy/ are valid")


if __name__ == "__main__":
    main()
