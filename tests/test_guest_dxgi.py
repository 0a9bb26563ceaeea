"""DXGI through ctypes COM, checked without Windows: the structure layouts against the SDK
headers' offsets, and the whole call sequence against COM objects built here in ctypes (a
vtable of callbacks behind an object's first word, as a COM object is laid out), so the
vtable indices, IIDs, arguments and reference counts are exercised for real. What this cannot
check — that Windows answers as documented — is the manual check in docs/shipping.md."""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Callable
from ctypes import POINTER, c_int32, c_uint32, c_void_p

import pytest

from igi_sdk.guest import dxgi
from igi_sdk.guest.adapters import AdapterInfo, match_adapter, pci_ids_from_nvml
from igi_sdk.guest.dxgi import (
    D3DKMT_ADAPTERADDRESS,
    D3DKMT_OPENADAPTERFROMLUID,
    D3DKMT_QUERYADAPTERINFO,
    DXGI_ADAPTER_DESC1,
    DXGI_QUERY_VIDEO_MEMORY_INFO,
    GUID,
    LUID,
    adapter_bus_id,
    open_adapter,
)

GIB = 1 << 30


def test_layouts_match_the_sdk_headers() -> None:
    assert ctypes.sizeof(GUID) == 16 and ctypes.sizeof(LUID) == 8
    assert ctypes.sizeof(DXGI_QUERY_VIDEO_MEMORY_INFO) == 32
    assert [getattr(DXGI_QUERY_VIDEO_MEMORY_INFO, f).offset for f in
            ("Budget", "CurrentUsage", "AvailableForReservation", "CurrentReservation")] == [
        0, 8, 16, 24]
    if ctypes.sizeof(c_void_p) == 8:  # 64-bit: the only Windows the bundle targets
        assert ctypes.sizeof(DXGI_ADAPTER_DESC1) == 312
        assert [getattr(DXGI_ADAPTER_DESC1, f).offset for f in (
            "VendorId", "DeviceId", "SubSysId", "Revision", "DedicatedVideoMemory",
            "DedicatedSystemMemory", "SharedSystemMemory", "AdapterLuid", "Flags")] == [
            256, 260, 264, 268, 272, 280, 288, 296, 304]
        assert ctypes.sizeof(D3DKMT_QUERYADAPTERINFO) == 24
        assert D3DKMT_QUERYADAPTERINFO.pPrivateDriverData.offset == 8
    assert ctypes.sizeof(D3DKMT_OPENADAPTERFROMLUID) == 12
    assert ctypes.sizeof(D3DKMT_ADAPTERADDRESS) == 12


def test_iids_and_vtable_indices() -> None:
    g = dxgi.guid(dxgi.IID_IDXGIAdapter3)
    assert (g.Data1, g.Data2, g.Data3) == (0x645967A4, 0x1392, 0x4310)
    assert bytes(g.Data4) == bytes.fromhex("a7988053ce3e93fd")
    # IUnknown 3 + IDXGIObject 4 + IDXGIFactory 5 = 12; IUnknown 3 + IDXGIObject 4 +
    # IDXGIAdapter 3 = 10 (GetDesc1); + GetDesc1, GetDesc2, two content-protection methods
    assert dxgi.ENUM_ADAPTERS1 == 12 and dxgi.GET_DESC1 == 10
    assert dxgi.QUERY_VIDEO_MEMORY_INFO == 14
    assert dxgi.DXGI_ERROR_NOT_FOUND == -2005270526  # 0x887A0002 as a LONG


WRONG_SLOTS: list[int] = []


# the Windows SDK's vtable slots, written out here (not taken from the code under test)
QUERY_INTERFACE, RELEASE, GET_DESC1, ENUM_ADAPTERS1, QUERY_VIDEO_MEMORY_INFO = 0, 2, 10, 12, 14


class FakeCom:
    """A COM object: its first word points to a vtable of C callbacks. A slot not given
    answers E_NOTIMPL and is recorded (a wrong index fails the test instead of crashing)."""

    def __init__(self, methods: dict[int, tuple[Callable[..., int], type, tuple[type, ...]]],
                 size: int = 18) -> None:
        self.refs = 1
        self.vtbl = (c_void_p * size)()
        self._keep: list[object] = []
        methods = {RELEASE: (self._release, c_uint32, ()), **methods}
        for index in range(size):
            if index not in methods:
                methods[index] = (self._wrong(index), c_int32, ())
        for index, (fn, restype, argtypes) in methods.items():
            cb = ctypes.CFUNCTYPE(restype, c_void_p, *argtypes)(fn)
            self._keep.append(cb)
            self.vtbl[index] = ctypes.cast(cb, c_void_p).value
        self.obj = (c_void_p * 1)(ctypes.addressof(self.vtbl))
        self.ptr = ctypes.addressof(self.obj)

    @staticmethod
    def _wrong(index: int) -> Callable[[int], int]:
        def call(this: int) -> int:
            WRONG_SLOTS.append(index)
            return ctypes.c_int32(0x80004001).value  # E_NOTIMPL

        return call

    def _release(self, this: int) -> int:
        assert this == self.ptr
        self.refs -= 1
        return self.refs


@pytest.fixture(autouse=True)
def _no_wrong_slots() -> object:
    WRONG_SLOTS.clear()
    yield
    assert WRONG_SLOTS == [], f"vtable slots called that the code must not call: {WRONG_SLOTS}"


def _out(ptr: int, value: int) -> None:
    ctypes.cast(ptr, POINTER(c_void_p))[0] = value


def make_adapter(name: str, vendor: int, device: int, subsys: int, luid: tuple[int, int],
                 flags: int = 0, qi: bool = True,
                 info: tuple[int, int] = (6 * GIB, GIB)) -> tuple[FakeCom, FakeCom]:
    """An IDXGIAdapter1 (GetDesc1, QueryInterface) and the IDXGIAdapter3 it hands out."""
    queries: list[tuple[int, int]] = []

    def query(this: int, node: int, group: int, out: int) -> int:
        queries.append((node, group))
        m = DXGI_QUERY_VIDEO_MEMORY_INFO.from_address(out)
        m.Budget, m.CurrentUsage = info
        m.AvailableForReservation, m.CurrentReservation = info[0] // 2, 0
        return 0

    a3 = FakeCom({QUERY_VIDEO_MEMORY_INFO: (query, c_int32, (c_uint32, c_int32, c_void_p))})
    a3.queries = queries  # type: ignore[attr-defined]

    def get_desc1(this: int, out: int) -> int:
        d = DXGI_ADAPTER_DESC1.from_address(out)
        text = name.encode("utf-16-le")
        ctypes.memmove(ctypes.addressof(d.Description), text, len(text))
        d.VendorId, d.DeviceId, d.SubSysId = vendor, device, subsys
        d.DedicatedVideoMemory = 8 * GIB
        d.AdapterLuid.HighPart, d.AdapterLuid.LowPart = luid
        d.Flags = flags
        return 0

    def query_interface(this: int, riid: int, out: int) -> int:
        asked = bytes((ctypes.c_ubyte * 16).from_address(riid))
        if not qi or asked != uuid.UUID(dxgi.IID_IDXGIAdapter3).bytes_le:
            _out(out, 0)
            return ctypes.c_int32(0x80004002).value  # E_NOINTERFACE
        a3.refs += 1
        _out(out, a3.ptr)
        return 0

    a1 = FakeCom({GET_DESC1: (get_desc1, c_int32, (c_void_p,)),
                  QUERY_INTERFACE: (query_interface, c_int32, (c_void_p, c_void_p))})
    a3.refs = 0  # only QueryInterface's reference
    return a1, a3


def make_factory(adapters: list[FakeCom]) -> tuple[FakeCom, Callable[[object, object], int]]:
    def enum_adapters1(this: int, index: int, out: int) -> int:
        if index >= len(adapters):
            _out(out, 0)
            return dxgi.DXGI_ERROR_NOT_FOUND
        _out(out, adapters[index].ptr)
        return 0

    factory = FakeCom({ENUM_ADAPTERS1: (enum_adapters1, c_int32, (c_uint32, c_void_p))})

    def create(riid: object, out: object) -> int:
        assert bytes(riid._obj) == uuid.UUID(dxgi.IID_IDXGIFactory1).bytes_le  # type: ignore[attr-defined]
        out._obj.value = factory.ptr  # type: ignore[attr-defined]
        return 0

    return factory, create


def test_open_and_query_through_the_vtables() -> None:
    igpu, _ = make_adapter("Intel(R) UHD Graphics", 0x8086, 0x9BC4, 0x22A17AA, (0, 0x1111))
    gpu, gpu3 = make_adapter("NVIDIA GeForce RTX 4070", 0x10DE, 0x2786, 0x51031458,
                             (0, 0x2222), info=(11 * GIB, 3 * GIB))
    warp, _ = make_adapter("Microsoft Basic Render Driver", 0x1414, 0x8C, 0, (0, 0x3333),
                           flags=dxgi.DXGI_ADAPTER_FLAG_SOFTWARE)
    factory, create = make_factory([igpu, gpu, warp])
    buses = {0x1111: "0000:00:02.0", 0x2222: "0000:01:00.0"}
    seen: list[list[AdapterInfo]] = []

    def choose(adapters: list[AdapterInfo]) -> AdapterInfo | None:
        seen.append(adapters)
        return match_adapter(adapters, "00000000:01:00.0", None)

    mem = open_adapter(choose, create, lambda luid: buses.get(luid.LowPart))
    assert mem is not None
    listed = seen[0]
    assert [a.description for a in listed] == ["Intel(R) UHD Graphics",
                                               "NVIDIA GeForce RTX 4070",
                                               "Microsoft Basic Render Driver"]
    assert listed[1].vendor_id == 0x10DE and listed[1].subsys_id == 0x51031458
    assert listed[1].luid == (0, 0x2222) and listed[1].dedicated == 8 * GIB
    assert listed[2].software and not listed[1].software
    assert mem.info.description == "NVIDIA GeForce RTX 4070"
    info = mem.query()
    assert info is not None
    assert (info.budget, info.current_usage) == (11 * GIB, 3 * GIB)
    assert gpu3.queries == [(0, dxgi.DXGI_MEMORY_SEGMENT_GROUP_LOCAL)]  # type: ignore[attr-defined]
    # every enumerated adapter released, the factory and IDXGIAdapter3 held until close
    assert (igpu.refs, gpu.refs, warp.refs) == (0, 0, 0)
    assert (factory.refs, gpu3.refs) == (1, 1)
    mem.close()
    assert (factory.refs, gpu3.refs) == (0, 0)
    assert mem.query() is None


def test_no_adapter3_or_no_match_releases_everything() -> None:
    gpu, gpu3 = make_adapter("old", 0x10DE, 0x1B80, 0, (0, 1), qi=False)
    factory, create = make_factory([gpu])
    assert open_adapter(lambda a: a[0], create, lambda luid: None) is None
    assert (factory.refs, gpu.refs, gpu3.refs) == (0, 0, 0)
    gpu, _ = make_adapter("x", 0x10DE, 0x2786, 0, (0, 1))
    factory, create = make_factory([gpu])
    assert open_adapter(lambda a: None, create, lambda luid: None) is None
    assert (factory.refs, gpu.refs) == (0, 0)


def test_failed_factory_raises_a_typed_error() -> None:
    def create(riid: object, out: object) -> int:
        return ctypes.c_int32(0x80004005).value  # E_FAIL

    with pytest.raises(dxgi.DxgiError, match="0x80004005"):
        open_adapter(lambda a: a[0], create, lambda luid: None)


class RecordingGdi32:
    def __init__(self, status: int = 0) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.status = status

    def D3DKMTOpenAdapterFromLuid(self, ref: object) -> int:
        o = ref._obj  # type: ignore[attr-defined]
        self.calls.append(("open", o.AdapterLuid.HighPart, o.AdapterLuid.LowPart))
        o.hAdapter = 0x40000000
        return 0

    def D3DKMTQueryAdapterInfo(self, ref: object) -> int:
        q = ref._obj  # type: ignore[attr-defined]
        self.calls.append(("query", q.hAdapter, q.Type, q.PrivateDriverDataSize))
        addr = D3DKMT_ADAPTERADDRESS.from_address(q.pPrivateDriverData)
        addr.BusNumber, addr.DeviceNumber, addr.FunctionNumber = 0xC1, 0, 0
        return self.status

    def D3DKMTCloseAdapter(self, ref: object) -> int:
        self.calls.append(("close", ref._obj.hAdapter))  # type: ignore[attr-defined]
        return 0


def test_bus_id_of_a_luid_through_d3dkmt() -> None:
    gdi = RecordingGdi32()
    assert adapter_bus_id(LUID(0x2222, 0), gdi) == "0000:c1:00.0"
    assert gdi.calls == [("open", 0, 0x2222), ("query", 0x40000000, 6, 12),
                         ("close", 0x40000000)]
    gdi = RecordingGdi32(status=ctypes.c_int32(0xC000000D).value)  # STATUS_INVALID_PARAMETER
    assert adapter_bus_id(LUID(1, 0), gdi) is None
    assert gdi.calls[-1] == ("close", 0x40000000)  # closed on failure too


def _adapter(index: int, vendor: int, device: int, subsys: int, bus: str | None,
             software: bool = False) -> AdapterInfo:
    return AdapterInfo(index, f"a{index}", vendor, device, subsys, (0, index), software,
                       8 * GIB, bus)


def test_matching_llama_cpp_s_gpu() -> None:
    igpu = _adapter(0, 0x8086, 0x9BC4, 1, "0000:00:02.0")
    a = _adapter(1, 0x10DE, 0x2786, 7, "0000:01:00.0")
    b = _adapter(2, 0x10DE, 0x2786, 7, "0000:02:00.0")
    warp = _adapter(3, 0x1414, 0x8C, 0, None, software=True)
    # by bus, with two identical cards
    assert match_adapter([igpu, a, b, warp], "00000000:02:00.0", (0x10DE, 0x2786, 7)) is b
    # D3DKMT gave no buses: the PCI ids decide when only one adapter has them
    a_, b_ = _adapter(1, 0x10DE, 0x2786, 7, None), _adapter(2, 0x10DE, 0x2684, 7, None)
    assert match_adapter([igpu, a_, b_], "0000:01:00.0", (0x10DE, 0x2786, 7)) is a_
    # ... and refuse when two have them
    twin = _adapter(4, 0x10DE, 0x2786, 7, None)
    assert match_adapter([a_, twin], "0000:01:00.0", (0x10DE, 0x2786, 7)) is None
    # an adapter known to be on another bus is never taken for its ids
    assert match_adapter([b], "0000:01:00.0", (0x10DE, 0x2786, 7)) is None
    # no NVML at all: the only hardware adapter, never the software one
    assert match_adapter([a, warp], None, None) is a
    assert match_adapter([igpu, a], None, None) is None


def test_nvml_pci_ids() -> None:
    # nvmlPciInfo_t of an RTX 4090: pciDeviceId 0x268410DE, pciSubSystemId 0x16F110DE
    assert pci_ids_from_nvml(0x268410DE, 0x16F110DE) == (0x10DE, 0x2684, 0x16F110DE)
