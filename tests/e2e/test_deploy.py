"""The deployment files (Dockerfile, deploy/kubernetes) pass tools/validate_deploy.py,
and the validator rejects what it should: a misspelled field, a value of the
wrong type, a grace period shorter than the server's shutdown timeout."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

VALIDATE = REPO / "tools" / "validate_deploy.py"


def validate(*args):
    return subprocess.run([sys.executable, str(VALIDATE), *args], capture_output=True, text=True, timeout=120)


def test_repository_manifests_are_valid():
    out = validate()
    assert out.returncode == 0, out.stderr
    assert "3 Kubernetes objects" in out.stdout


@pytest.mark.parametrize("old,new,message", [
    ("readinessProbe:", "readinesProbe:", "readinesProbe is not in the Kubernetes API"),
    ("replicas: 2", "replicas: two", "valid integer"),
    ("terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 20", "must exceed --shutdown-timeout"),
    ("memory: 2Gi", "memory: 1Gi", "below --kv-cache-memory"),
])
def test_broken_manifests_are_rejected(tmp_path, old, new, message):
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    manifest = deploy / "kubernetes" / "deployment.yaml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new, 1))
    out = validate("--dir", str(deploy))
    assert out.returncode == 1
    assert message in out.stderr


def test_dockerfile_runs_the_server_on_the_default_model():
    text = (REPO / "Dockerfile").read_text()
    assert "FROM debian:12 AS build" in text and "FROM debian:12-slim" in text
    assert '"pagellm", "serve", "--model", "/models/model.gguf"' in text
