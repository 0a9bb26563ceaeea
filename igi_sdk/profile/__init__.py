"""The benchmark profile of a machine (pure data; measuring it lives in ``profile.measure``)."""

from igi_sdk.profile.data import DeviceProfile, Profile, cache_dir

__all__ = ["DeviceProfile", "Profile", "cache_dir"]
