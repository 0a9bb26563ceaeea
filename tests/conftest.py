"""Shared fixtures: synthetic models (random weights, real architectures) and the default model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import igi_sdk  # noqa: F401  (native import order)
from igi_sdk import threads
from igi_sdk.model import default_model_path, write_synthetic_gguf

# Thread ownership is asserted in every test (igi_sdk/threads.py); sidecars the tests start
# inherit it through the environment.
os.environ["IGI_SDK_THREAD_CHECKS"] = "1"


@pytest.fixture(autouse=True)
def _thread_ownership() -> Iterator[None]:
    """A test fails when code ran on a thread that does not own it, even where the breach
    happened on a thread whose errors are only logged."""
    threads.breaches.clear()
    yield
    assert not threads.breaches, threads.breaches


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_gguf(tmp_path_factory.mktemp("models") / "tiny-llama.gguf",
                                "tiny-llama")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_gguf(tmp_path_factory.mktemp("models") / "tiny-qwen3moe.gguf",
                                "tiny-qwen3moe")


@pytest.fixture(scope="session")
def default_model() -> Path:
    # The README's install puts it there; a missing default model is a failed install, not a skip.
    return default_model_path()
