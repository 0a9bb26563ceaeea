"""TEMP"""
from igi_sdk.profile.measure import load_or_measure
from igi_sdk.runtime.autoplan import plan_for_model


def prepare_backend(inventory, prof, pinned=False):
    return None


__all__ = ["load_or_measure", "plan_for_model", "prepare_backend"]
