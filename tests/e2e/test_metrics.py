"""/metrics parses as Prometheus text, with vLLM's metric names under our
prefix, and counts what the requests did."""

import requests

import prom
from conftest import openai_client

GAUGES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_blocks_total",
          "kv_blocks_used", "kv_blocks_cached", "kv_blocks_free"]
COUNTERS = ["prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
            "generation_tokens_total", "num_preemptions_total", "request_success_total"]
HISTOGRAMS = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "iteration_tokens_total"]


def scrape(server):
    r = requests.get(server.url("/metrics"), timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    return prom.parse(r.text)


def test_metric_families(stories_server):
    m = scrape(stories_server)
    for name in GAUGES:
        assert m["pagellm:" + name]["type"] == "gauge", name
    for name in COUNTERS:
        assert m["pagellm:" + name]["type"] == "counter", name
    for name in HISTOGRAMS:
        assert m["pagellm:" + name]["type"] == "histogram", name
    for fam in m.values():
        for _, labels, _ in fam["samples"]:
            assert labels["model_name"] == "stories260K"
    reasons = {l["finished_reason"] for _, l, _ in m["pagellm:request_success_total"]["samples"]}
    assert {"stop", "length", "abort"} <= reasons
    total = prom.value(m, "pagellm:kv_blocks_total")
    parts = sum(prom.value(m, "pagellm:kv_blocks_" + k) for k in ("used", "free"))
    assert total == parts and total > 0


def test_metrics_count_requests(stories_server):
    before = scrape(stories_server)
    client = openai_client(stories_server)
    prompt = ("The cat sat on the mat and looked at the bird in the tree. The dog ran to the park to play with "
              "a big red ball, and the sun was warm and bright all day long.")
    for _ in range(2):  # the second one hits the prefix cache
        client.completions.create(model="stories260K", prompt=prompt, max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    after = scrape(stories_server)

    def delta(family, name=None, **labels):
        return prom.value(after, family, name, **labels) - prom.value(before, family, name, **labels)

    assert delta("pagellm:generation_tokens_total") == 14
    n_prompt = requests.post(stories_server.url("/tokenize"), json={"prompt": prompt}, timeout=10).json()["count"]
    assert delta("pagellm:prompt_tokens_total") == 2 * n_prompt
    assert delta("pagellm:request_success_total", finished_reason="length") == 2
    assert delta("pagellm:e2e_request_latency_seconds", "pagellm:e2e_request_latency_seconds_count") == 2
    assert delta("pagellm:time_to_first_token_seconds", "pagellm:time_to_first_token_seconds_count") == 2
    assert delta("pagellm:inter_token_latency_seconds", "pagellm:inter_token_latency_seconds_count") == 12
    assert delta("pagellm:prefix_cache_hits_total") > 0
    assert prom.value(after, "pagellm:num_requests_running") == 0
    assert prom.value(after, "pagellm:kv_blocks_used") == 0
    http = {(l["route"], l["status"]): v for n, l, v in after["pagellm:http_requests_total"]["samples"]}
    assert http[("/v1/completions", "200")] >= 2


def test_grafana_dashboard_uses_served_metrics(stories_server):
    import json
    import re

    from conftest import REPO

    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    served = scrape(stories_server)
    used = set()
    for e in exprs:
        for name in re.findall(r"pagellm:[a-zA-Z0-9_:]+", e):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base not in served or (name != base and served[base]["type"] != "histogram"):
                base = name
            used.add(base)
            assert base in served, f"the dashboard uses {name}, which /metrics does not export"
    assert len(used) >= 15


def test_alert_rules_use_served_metrics(stories_server):
    import re

    import yaml

    from conftest import REPO

    doc = yaml.safe_load((REPO / "deploy" / "prometheus-alerts.yaml").read_text())
    rules = {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}
    assert all(r.get("for") and r["labels"]["severity"] for g in doc["groups"] for r in g["rules"])
    assert {"PagellmQueueGrowing", "PagellmKVCacheFull", "PagellmPreemptionStorm"} <= set(rules)
    served = scrape(stories_server)
    for alert, expr in rules.items():
        for name in re.findall(r"pagellm:[a-zA-Z0-9_:]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in served or name in served, f"alert {alert} uses {name}, which /metrics does not export"
