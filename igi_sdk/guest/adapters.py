"""Windows' graphics adapters as DXGI lists them, and which one is llama.cpp's GPU (pure).

NVML and CUDA identify a GPU by its PCI bus id; DXGI by a LUID, with the PCI vendor, device
and subsystem ids in its description. The bus id of a LUID comes from D3DKMT
(``guest.dxgi.adapter_bus_id``) where the driver answers; otherwise the PCI ids decide, as
long as only one adapter has them (two identical cards cannot be told apart that way)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("igi_sdk.guest")


@dataclass(frozen=True)
class AdapterInfo:
    index: int  # EnumAdapters1's index
    description: str
    vendor_id: int
    device_id: int
    subsys_id: int
    luid: tuple[int, int]  # (HighPart, LowPart)
    software: bool  # DXGI_ADAPTER_FLAG_SOFTWARE: the Basic Render Driver (WARP)
    dedicated: int  # DedicatedVideoMemory, bytes
    bus_id: str | None = None  # "0000:01:00.0" from D3DKMT, None where unknown


@dataclass(frozen=True)
class DxgiMemoryInfo:
    """``DXGI_QUERY_VIDEO_MEMORY_INFO`` of the local segment group, for this process."""

    budget: int  # what the OS lets this process keep resident now, bytes
    current_usage: int  # what this process uses on the adapter, bytes
    available_for_reservation: int
    current_reservation: int


def pci_ids_from_nvml(pci_device_id: int, pci_subsystem_id: int) -> tuple[int, int, int]:
    """(vendor, device, subsystem) from NVML's ``nvmlPciInfo_t``: ``pciDeviceId`` packs the
    device id in the upper 16 bits and the vendor id in the lower 16; ``pciSubSystemId`` is
    the same 32-bit value DXGI reports as ``SubSysId``."""
    return (pci_device_id & 0xFFFF, (pci_device_id >> 16) & 0xFFFF, pci_subsystem_id & 0xFFFFFFFF)


def match_adapter(adapters: Sequence[AdapterInfo], bus_id: str | None,
                  pci_ids: tuple[int, int, int] | None) -> AdapterInfo | None:
    """The hardware adapter that is the GPU at ``bus_id`` with ``pci_ids``, or None.

    By bus id where D3DKMT gave the adapter's; else by PCI ids if exactly one candidate has
    them; with neither known (no NVML), the only hardware adapter if there is one."""
    from igi_sdk.runtime.nvml import normalise_bus_id

    hardware = [a for a in adapters if not a.software]
    target = normalise_bus_id(bus_id)
    if target is not None:
        for a in hardware:
            if normalise_bus_id(a.bus_id) == target:
                return a
        # an adapter known to sit on another bus is not it, whatever its ids
        hardware = [a for a in hardware if a.bus_id is None]
    if pci_ids is not None:
        same = [a for a in hardware if (a.vendor_id, a.device_id, a.subsys_id) == pci_ids]
        if len(same) == 1:
            return same[0]
        if len(same) > 1:
            log.warning("%d DXGI adapters are %04x:%04x and none gave its PCI bus: no DXGI "
                        "video memory figures", len(same), pci_ids[0], pci_ids[1])
        return None
    if target is None and len(hardware) == 1:
        return hardware[0]
    return None
