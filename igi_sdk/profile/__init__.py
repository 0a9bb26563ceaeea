"""The benchmark profile of a machine (pure data; measuring it lives in ``igi_sdk.tuning``)."""

from igi_sdk.profile.data import DeviceProfile, Profile, cache_dir

__all__ = ["DeviceProfile", "Profile", "cache_dir"]
