"""DXGI's per-process video memory figures on Windows, through ctypes COM.

``CreateDXGIFactory1`` → ``IDXGIFactory1::EnumAdapters1`` (and ``GetDesc1`` of each) → the
adapter that is llama.cpp's GPU → ``QueryInterface(IID_IDXGIAdapter3)`` →
``IDXGIAdapter3::QueryVideoMemoryInfo(0, DXGI_MEMORY_SEGMENT_GROUP_LOCAL)``: the budget the OS
gives this process and what this process uses, on that adapter. No Direct3D device is needed.

COM methods are called through each object's vtable: the object's first pointer-sized word
points to an array of function pointers in declaration order, bases first. The indices below
are counted in the Windows SDK's ``dxgi.h``, ``dxgi1_2.h``, ``dxgi1_3.h`` and ``dxgi1_4.h``.
Layouts are given with ``c_uint16`` for WCHAR (2 bytes on Windows; ``c_wchar`` is 4 on Linux,
where the layouts are tested) so that they are the same everywhere."""

from __future__ import annotations

import ctypes
import logging
import uuid
from collections.abc import Callable
from ctypes import POINTER, byref, c_int32, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p

from igi_sdk.guest.adapters import AdapterInfo, DxgiMemoryInfo

log = logging.getLogger("igi_sdk.guest")

HRESULT = c_int32  # LONG: 32 bits on Windows (ctypes.c_long is 64 on Linux)
DXGI_ERROR_NOT_FOUND = ctypes.c_int32(0x887A0002).value  # EnumAdapters1 past the last
DXGI_ADAPTER_FLAG_SOFTWARE = 2
DXGI_MEMORY_SEGMENT_GROUP_LOCAL = 0  # dedicated VRAM on a discrete GPU; NON_LOCAL = 1

# vtable indices
# IUnknown: QueryInterface 0, AddRef 1, Release 2
QUERY_INTERFACE, RELEASE = 0, 2
# IDXGIObject (dxgi.h): SetPrivateData 3, SetPrivateDataInterface 4, GetPrivateData 5,
# GetParent 6; IDXGIFactory: EnumAdapters 7, MakeWindowAssociation 8,
# GetWindowAssociation 9, CreateSwapChain 10, CreateSoftwareAdapter 11;
# IDXGIFactory1: EnumAdapters1 12, IsCurrent 13
ENUM_ADAPTERS1 = 12
# IDXGIAdapter (after IDXGIObject's 3-6): EnumOutputs 7, GetDesc 8, CheckInterfaceSupport 9;
# IDXGIAdapter1: GetDesc1 10; IDXGIAdapter2 (dxgi1_2.h): GetDesc2 11;
# IDXGIAdapter3 (dxgi1_4.h): RegisterHardwareContentProtectionTeardownStatusEvent 12,
# UnregisterHardwareContentProtectionTeardownStatus 13, QueryVideoMemoryInfo 14,
# SetVideoMemoryReservation 15, RegisterVideoMemoryBudgetChangeNotificationEvent 16,
# UnregisterVideoMemoryBudgetChangeNotification 17
GET_DESC1 = 10
QUERY_VIDEO_MEMORY_INFO = 14

IID_IDXGIFactory1 = "770aae78-f26f-4dba-a829-253c83d1b387"
IID_IDXGIAdapter3 = "645967a4-1392-4310-a798-8053ce3e93fd"

# stdcall is the Windows COM convention; on x64 there is one convention and both are the same
_FUNCTYPE = getattr(ctypes, "WINFUNCTYPE", ctypes.CFUNCTYPE)


class GUID(ctypes.Structure):
    _fields_ = (("Data1", c_uint32), ("Data2", c_uint16), ("Data3", c_uint16),
                ("Data4", ctypes.c_ubyte * 8))


def guid(text: str) -> GUID:
    return GUID.from_buffer_copy(uuid.UUID(text).bytes_le)


class LUID(ctypes.Structure):  # winnt.h: DWORD LowPart; LONG HighPart (8 bytes)
    _fields_ = (("LowPart", c_uint32), ("HighPart", c_int32))


class DXGI_ADAPTER_DESC1(ctypes.Structure):
    # dxgi.h; offsets on 64-bit Windows: Description 0 (WCHAR[128]), VendorId 256,
    # DeviceId 260, SubSysId 264, Revision 268, DedicatedVideoMemory 272 (SIZE_T),
    # DedicatedSystemMemory 280, SharedSystemMemory 288, AdapterLuid 296, Flags 304; size 312
    _fields_ = (("Description", c_uint16 * 128),
                ("VendorId", c_uint32), ("DeviceId", c_uint32), ("SubSysId", c_uint32),
                ("Revision", c_uint32),
                ("DedicatedVideoMemory", c_size_t), ("DedicatedSystemMemory", c_size_t),
                ("SharedSystemMemory", c_size_t),
                ("AdapterLuid", LUID), ("Flags", c_uint32))


class DXGI_QUERY_VIDEO_MEMORY_INFO(ctypes.Structure):
    # dxgi1_4.h: four UINT64, 32 bytes
    _fields_ = (("Budget", c_uint64), ("CurrentUsage", c_uint64),
                ("AvailableForReservation", c_uint64), ("CurrentReservation", c_uint64))


# d3dkmthk.h: the PCI location of an adapter, by its LUID (gdi32.dll)
KMTQAITYPE_ADAPTERADDRESS = 6


class D3DKMT_OPENADAPTERFROMLUID(ctypes.Structure):
    _fields_ = (("AdapterLuid", LUID), ("hAdapter", c_uint32))  # 12 bytes


class D3DKMT_QUERYADAPTERINFO(ctypes.Structure):
    # D3DKMT_HANDLE hAdapter 0; KMTQUERYADAPTERINFOTYPE Type 4; VOID* pPrivateDriverData 8;
    # UINT PrivateDriverDataSize 16; 24 bytes on 64-bit
    _fields_ = (("hAdapter", c_uint32), ("Type", c_int32), ("pPrivateDriverData", c_void_p),
                ("PrivateDriverDataSize", c_uint32))


class D3DKMT_ADAPTERADDRESS(ctypes.Structure):
    _fields_ = (("BusNumber", c_uint32), ("DeviceNumber", c_uint32),
                ("FunctionNumber", c_uint32))


class D3DKMT_CLOSEADAPTER(ctypes.Structure):
    _fields_ = (("hAdapter", c_uint32),)


class DxgiError(OSError):
    """A DXGI call failed (its HRESULT in ``hresult``)."""

    def __init__(self, what: str, hresult: int) -> None:
        super().__init__(f"{what} failed: HRESULT 0x{hresult & 0xFFFFFFFF:08X}")
        self.hresult = hresult


def vcall(obj: int, index: int, restype: type, argtypes: tuple[type, ...],
          *args: object) -> int:
    """Call method ``index`` of the COM object at address ``obj`` (``this`` first)."""
    vtbl = ctypes.cast(c_void_p(obj), POINTER(POINTER(c_void_p))).contents
    fn = _FUNCTYPE(restype, c_void_p, *argtypes)(vtbl[index])
    return fn(c_void_p(obj), *args)  # type: ignore[no-any-return]


def release(obj: int | None) -> None:
    if obj:
        vcall(obj, RELEASE, c_uint32, ())


def _check(what: str, hr: int) -> None:
    if hr < 0:
        raise DxgiError(what, hr)


def describe(adapter: int, index: int, bus_id: Callable[[LUID], str | None]) -> AdapterInfo:
    desc = DXGI_ADAPTER_DESC1()
    _check("IDXGIAdapter1::GetDesc1",
           vcall(adapter, GET_DESC1, HRESULT, (POINTER(DXGI_ADAPTER_DESC1),), byref(desc)))
    name = bytes(desc.Description).decode("utf-16-le", errors="replace").split("\0", 1)[0]
    luid = desc.AdapterLuid
    return AdapterInfo(index, name, desc.VendorId, desc.DeviceId, desc.SubSysId,
                       (luid.HighPart, luid.LowPart),
                       bool(desc.Flags & DXGI_ADAPTER_FLAG_SOFTWARE),
                       int(desc.DedicatedVideoMemory), bus_id(luid))


def adapter_bus_id(luid: LUID, gdi32: object = None) -> str | None:
    """The PCI bus id ("0000:BB:DD.F"; D3DKMT gives no domain) of the adapter ``luid``, or
    None where the driver does not say."""
    try:
        gdi = gdi32 if gdi32 is not None else ctypes.WinDLL("gdi32")  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None
    opened = D3DKMT_OPENADAPTERFROMLUID(luid, 0)
    if gdi.D3DKMTOpenAdapterFromLuid(byref(opened)) != 0:  # type: ignore[attr-defined]
        return None
    try:
        addr = D3DKMT_ADAPTERADDRESS()
        query = D3DKMT_QUERYADAPTERINFO(opened.hAdapter, KMTQAITYPE_ADAPTERADDRESS,
                                        ctypes.addressof(addr), ctypes.sizeof(addr))
        if gdi.D3DKMTQueryAdapterInfo(byref(query)) != 0:  # type: ignore[attr-defined]
            return None
        return f"0000:{addr.BusNumber:02x}:{addr.DeviceNumber:02x}.{addr.FunctionNumber:x}"
    finally:
        gdi.D3DKMTCloseAdapter(byref(D3DKMT_CLOSEADAPTER(opened.hAdapter)))  # type: ignore[attr-defined]


def _create_factory1(riid: object, out: object) -> int:
    dxgi = ctypes.WinDLL("dxgi")  # type: ignore[attr-defined]
    dxgi.CreateDXGIFactory1.restype = HRESULT
    dxgi.CreateDXGIFactory1.argtypes = (POINTER(GUID), POINTER(c_void_p))
    return int(dxgi.CreateDXGIFactory1(riid, out))


class DxgiAdapterMemory:
    """One adapter's ``IDXGIAdapter3``, queried for this process's figures; thread-safe (DXGI
    objects are free-threaded), cheap enough to read at the arbiter's 40 Hz."""

    def __init__(self, adapter3: int, factory: int, info: AdapterInfo) -> None:
        self.adapter3, self.factory, self.info = adapter3, factory, info

    def query(self) -> DxgiMemoryInfo | None:
        if not self.adapter3:
            return None
        out = DXGI_QUERY_VIDEO_MEMORY_INFO()
        hr = vcall(self.adapter3, QUERY_VIDEO_MEMORY_INFO, HRESULT,
                   (c_uint32, c_int32, POINTER(DXGI_QUERY_VIDEO_MEMORY_INFO)),
                   0, DXGI_MEMORY_SEGMENT_GROUP_LOCAL, byref(out))
        if hr < 0:  # a removed device (driver reset): no figures until it is back
            return None
        return DxgiMemoryInfo(int(out.Budget), int(out.CurrentUsage),
                              int(out.AvailableForReservation), int(out.CurrentReservation))

    def close(self) -> None:
        adapter3, factory, self.adapter3, self.factory = self.adapter3, self.factory, 0, 0
        release(adapter3)
        release(factory)


def open_adapter(choose: Callable[[list[AdapterInfo]], AdapterInfo | None],
                 create_factory: Callable[[object, object], int] = _create_factory1,
                 bus_id: Callable[[LUID], str | None] = adapter_bus_id,
                 ) -> DxgiAdapterMemory | None:
    """Enumerate the adapters, let ``choose`` pick one (None: no figures) and open its
    ``IDXGIAdapter3`` (Windows 10 and later; None before)."""
    factory = c_void_p()
    _check("CreateDXGIFactory1", create_factory(byref(guid(IID_IDXGIFactory1)), byref(factory)))
    adapters: list[tuple[AdapterInfo, int]] = []
    opened: DxgiAdapterMemory | None = None
    try:
        for index in range(64):
            ptr = c_void_p()
            hr = vcall(factory.value or 0, ENUM_ADAPTERS1, HRESULT,
                       (c_uint32, POINTER(c_void_p)), index, byref(ptr))
            if hr == DXGI_ERROR_NOT_FOUND:
                break
            _check("IDXGIFactory1::EnumAdapters1", hr)
            adapters.append((describe(ptr.value or 0, index, bus_id), ptr.value or 0))
        chosen = choose([a for a, _ in adapters])
        if chosen is None:
            return None
        adapter3 = c_void_p()
        hr = vcall(adapters[chosen.index][1], QUERY_INTERFACE, HRESULT,
                   (POINTER(GUID), POINTER(c_void_p)), byref(guid(IID_IDXGIAdapter3)),
                   byref(adapter3))
        if hr < 0 or not adapter3.value:
            log.info("no IDXGIAdapter3 on %s (Windows before 10?): no DXGI figures",
                     chosen.description)
            return None
        opened = DxgiAdapterMemory(adapter3.value, factory.value or 0, chosen)
        return opened
    finally:
        for _, ptr in adapters:  # QueryInterface took its own reference
            release(ptr)
        if opened is None:
            release(factory.value)
