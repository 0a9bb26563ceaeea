"""The imperative shell over llama.cpp: apply a Plan, run sessions, reshard losslessly."""

from igi_sdk.runtime.devices import Device, list_devices
from igi_sdk.runtime.engine import Engine, EngineConfig
from igi_sdk.runtime.generation import Generation, GenerationResult
from igi_sdk.runtime.image_turn import ImageInput
from igi_sdk.runtime.sampling import SamplingParams

__all__ = [
    "Device",
    "Engine",
    "EngineConfig",
    "Generation",
    "GenerationResult",
    "ImageInput",
    "SamplingParams",
    "list_devices",
]
