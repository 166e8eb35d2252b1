"""Shared fixtures for the end-to-end tests: where the binary and test data are."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _shared_data():
    return pathlib.Path(os.environ.get("PAGELLM_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def pagellm_bin():
    path = pathlib.Path(os.environ.get("PAGELLM_BIN", ROOT / "build" / "pagellm"))
    if not path.exists():
        pytest.fail(f"pagellm binary not found at {path} (build first, or set PAGELLM_BIN)")
    return str(path)


@pytest.fixture(scope="session")
def stories_model():
    path = _shared_data() / "models" / "stories260K.gguf"
    if not path.exists():
        pytest.skip(f"missing test data: {path}")
    return str(path)


@pytest.fixture(scope="session")
def default_model():
    env = os.environ.get("PAGELLM_MODEL")
    if env:
        return env
    marker = ROOT / "build" / "default-model.txt"
    if marker.exists():
        path = marker.read_text().strip()
        if os.path.exists(path):
            return path
    pytest.skip("default model not installed (run tools/setup.sh)")
