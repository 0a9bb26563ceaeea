"""Shared fixtures: synthetic models (random weights, real architectures), the default model, and
logits rows of a synthetic model for the sampler tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def decoded(tiny_llama: Path) -> Iterator[tuple[Any, Any]]:
    """A context whose last decode left logits rows 0 and 1, and its vocabulary (the sampler
    tests craft the rows' values). Its imports are here: at the top, ``llama_cpp`` would sort
    before the package's own import, which must come first (igi_sdk/__init__.py)."""
    import llama_cpp

    from igi_sdk.model import read_inventory
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import loader
    from igi_sdk.runtime.loader import ContextSettings

    inv = read_inventory(tiny_llama)
    loaded = loader.load(tiny_llama, inv, Plan.all_cpu(), ContextSettings(256, 1, 64, 1,
                                                                           n_outputs=2))
    batch = llama_cpp.llama_batch_init(2, 0, 1)
    for i, tok in enumerate((5, 77)):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, 1
    batch.n_tokens = 2
    assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
    try:
        yield loaded.ctx, llama_cpp.llama_model_get_vocab(loaded.model)
    finally:
        llama_cpp.llama_batch_free(batch)
        loader.free(loaded)
