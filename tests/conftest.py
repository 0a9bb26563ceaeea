"""Shared fixtures: synthetic models (random weights, real architectures) and the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

import igi_sdk  # noqa: F401  (native import order)
from igi_sdk.model import default_model_path, write_synthetic_gguf


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
