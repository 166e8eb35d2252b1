"""The deployment files (Dockerfile, deploy/kubernetes) pass tools/validate_deploy.py,
and the validator rejects what it should: a misspelled field, a value of the
wrong type, a grace period shorter than the server's shutdown timeout."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, REPO

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
    ("terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 33", "plus the preStop sleep 5"),
    ('command: ["sleep", "5"]', 'command: []', "add a preStop sleep"),
    ("as: pagellm_num_requests_waiting", "as: pagellm_queue", "no rule serves the autoscaler's metric"),
])
def test_broken_manifests_are_rejected(tmp_path, old, new, message):
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    manifest = deploy / "kubernetes" / "deployment.yaml"
    if old.startswith("as: "):  # the metrics adapter's rule
        manifest = deploy / "prometheus-adapter-values.yaml"
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
    # The runtime stage installs what the binary links, and fails the build if it cannot start.
    assert "tools/runtime_packages.sh build/pagellm" in text
    assert "RUN pagellm --version" in text


def test_runtime_packages_hold_every_linked_library():
    """The list the image installs covers every library the binary loads: here,
    each listed package is installed and owns one of them, and OpenMPI's
    library (which the slim image lacked) is among them."""
    out = subprocess.run([str(REPO / "tools" / "runtime_packages.sh"), str(BIN)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    packages = out.stdout.split()
    assert "libc6" in packages and "libstdc++6" in packages
    linked = subprocess.run(["ldd", str(BIN)], capture_output=True, text=True).stdout
    if "libmpi.so" in linked:
        assert "libopenmpi3" in packages
    owned = subprocess.run(["dpkg", "-L", *packages], capture_output=True, text=True).stdout
    for line in linked.splitlines():
        parts = line.split()
        if "=>" in parts and parts[2].startswith("/"):
            name = Path(parts[2]).name
            assert f"/{name}" in owned, f"{name} is in no listed package"


def test_no_answering_runtime_means_no_build(tmp_path):
    """A docker client without a daemon (this kind of machine has one) is not a
    container runtime: --build says so, builds nothing, and the check passes."""
    for name in ("docker", "podman"):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
        fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run([sys.executable, str(VALIDATE), "--build"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "no container runtime answers" in out.stdout
