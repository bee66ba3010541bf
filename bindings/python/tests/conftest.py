"""Shared fixtures of the Python package's tests: the test models (``MICA_TEST_MODELS``, as
for the Rust tests; ``scripts/test`` sets it), the ``mica`` binary and the facade's
``logits`` example (built by ``cargo test``, which ``scripts/test`` runs first), and one
``Model`` of SmolLM2-135M shared by the tests that only read from it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

import mica

REPO = pathlib.Path(__file__).resolve().parents[3]
SMOL = "smollm2-135m-instruct-q4_1.gguf"
# The tests run on a 2-core machine beside other work: one compute thread per engine keeps
# them predictable.
THREADS = 1


def models_dir() -> pathlib.Path:
    d = os.environ.get("MICA_TEST_MODELS")
    if not d:
        pytest.fail("set MICA_TEST_MODELS to the test models' directory (scripts/test does)")
    p = pathlib.Path(d)
    if not (p / SMOL).is_file():
        pytest.fail(f"{p / SMOL} is missing: run scripts/fetch-test-models")
    return p


def repo_binary(rel: str, cargo_args: list) -> pathlib.Path:
    """A binary of the repository's workspace under target/debug, built when missing."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / rel
    if not path.is_file():
        subprocess.run(["cargo", "build", "--locked", *cargo_args], cwd=REPO, check=True)
    if not path.is_file():
        pytest.fail(f"{path} was not built")
    return path


@pytest.fixture(scope="session")
def smol_path() -> pathlib.Path:
    return models_dir() / SMOL


@pytest.fixture(scope="session")
def model(smol_path: pathlib.Path) -> mica.Model:
    return mica.Model(smol_path, n_threads=THREADS, kv_mem=64 << 20)


@pytest.fixture(scope="session")
def mica_bin() -> pathlib.Path:
    return repo_binary("mica", ["-p", "mica-cli", "--bin", "mica"])


@pytest.fixture(scope="session")
def logits_bin() -> pathlib.Path:
    return repo_binary("examples/logits", ["-p", "mica", "--example", "logits"])


@pytest.fixture(scope="session")
def golden() -> dict:
    return json.loads((REPO / "fixtures/golden" / "smollm2-135m-instruct-q4_1.json").read_text())
