"""A fake ``pynvml`` for the node agent's tests, built from what a real H200
answered (tests/data/h200-nvml-probe.json, recorded with /work/shared/gpu's
nvml_probe.py on driver 580.159.04): the calls it supported answer with the
recorded values, the ones it did not raise ``NVMLError_NotSupported``. Two more
profiles, not recorded but shaped after NVIDIA's documentation: ``blackwell``
(no per-link NVLink calls, but NVLink field values and a completed fabric with a
clique) and ``older`` (Volta-like: no row remapping, retired pages, per-link NVLink
counters, no fabric, only the old ``...ThrottleReasons`` name).

Put one in ``sys.modules["pynvml"]`` and ``fleet.agent.NvmlGpus`` runs unchanged.
The names, constants and exception classes are pynvml's (nvidia-ml-py 13.x).
Each GPU is a ``FakeGpu`` whose fields a test may change between reads;
``calls`` counts every device call by name.
"""

from __future__ import annotations

import ast
import ctypes
import json
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE = Path(__file__).resolve().parent / "data" / "h200-nvml-probe.json"

# --- pynvml's constants ----------------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999
_STRINGS = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As pynvml's: ``NVMLError(code)`` is an instance of the code's subclass."""

    _by_code: dict[int, type[NVMLError]] = {}
    code = NVML_ERROR_UNKNOWN
    value: int

    def __new__(cls, value: int | None = None):
        if cls is NVMLError and value in NVMLError._by_code:
            cls = NVMLError._by_code[value]
        obj = Exception.__new__(cls)
        obj.value = cls.code if value is None else value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {"code": code})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_ArgumentVersionMismatch = _error_class(
    "NVMLError_ArgumentVersionMismatch", NVML_ERROR_ARGUMENT_VERSION_MISMATCH
)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

NVML_TEMPERATURE_GPU = 0
NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 1, 3
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, NVML_GPU_FABRIC_STATE_COMPLETED = 0, 3
nvmlEventTypeXidCriticalError = 8
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlGpuFabricInfo_v3 = 0x3000028


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), *c_nvmlGpuFabricInfo_t._fields_, ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    _fields_ = [*c_nvmlGpuFabricInfo_v2_t._fields_, ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


# --- the GPUs --------------------------------------------------------------------------


@dataclass
class FakeGpu:
    """One GPU's answers. None: the call raises NVMLError_NotSupported."""

    index: int
    temperature: int | None = 40
    power_mw: int | None = 80_000
    clocks_mask: int | None = 1
    ecc: dict[str, int] | None = field(
        default_factory=lambda: dict.fromkeys(
            ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected"), 0
        )
    )
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired_pages: tuple[list[int], list[int]] | None = None  # single-bit, double-bit page addresses
    retired_pending: int | None = None
    pcie_replay: int | None = 0
    # link -> {"state": 0|1, "replay": n, ...}; None: every per-link call is NotSupported
    links: dict[int, dict[str, int]] | None = None
    fields: dict[int, tuple[int, int]] = field(default_factory=dict)  # field id -> (nvmlReturn, value)
    fabric: dict[str, Any] | None = None  # clusterUuid (bytes), status, cliqueId, state, healthMask
    fabric_versions: tuple[int, ...] = (nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3)
    failing: dict[str, NVMLError] = field(default_factory=dict)  # call name -> what it raises
    lose_on: str | None = None  # the GPU falls off the bus when this call is made
    lost: bool = False


def _probe_value(calls: dict[str, Any], name: str) -> Any:
    """A recorded answer, or None where the H200 said Not Supported."""
    call = calls.get(name)
    if call is None or not call["ok"]:
        return None
    return ast.literal_eval(call["value"])


def h200_gpu(index: int = 0) -> FakeGpu:
    """GPU ``index`` as the H200 answered."""
    probe = json.loads(PROBE.read_text())
    calls = probe["calls"]
    ecc = {
        "volatile_corrected": _probe_value(calls, "ecc_corrected_volatile"),
        "volatile_uncorrected": _probe_value(calls, "ecc_uncorrected_volatile"),
        "aggregate_corrected": 0,  # not asked by the probe; nvidia-smi -q showed 0
        "aggregate_uncorrected": _probe_value(calls, "ecc_uncorrected_aggregate"),
    }
    fields = {
        globals()[name]: (ret, value)
        for name, (ret, value) in probe["field_values"].items()
        if name in globals()  # the NVLink ones; the rest the agent does not ask
    }
    return FakeGpu(
        index=index,
        temperature=_probe_value(calls, "temperature"),
        power_mw=_probe_value(calls, "power_mw"),
        clocks_mask=_probe_value(calls, "clocks_event_reasons"),
        ecc=ecc,
        remapped_rows=_probe_value(calls, "remapped_rows"),
        retired_pending=_probe_value(calls, "retired_pages_pending"),
        pcie_replay=_probe_value(calls, "pcie_replay"),
        links=None,  # every nvlinkN_state call was Not Supported (checked in the tests)
        fields=fields,
        # The probe did not record the struct; nvidia-smi -q shows Fabric State and
        # Status N/A: not supported (no NVLink peers here).
        fabric={"state": NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, "status": NVML_ERROR_NOT_SUPPORTED},
    )


CLUSTER_UUID = bytes.fromhex("6f2c1d7e9a8b4c3d8e7f605142332415")


def blackwell_gpu(index: int = 0) -> FakeGpu:
    gpu = h200_gpu(index)
    gpu.power_mw, gpu.clocks_mask = 612_300, 0
    gpu.fields = {
        NVML_FI_DEV_NVLINK_LINK_COUNT: (NVML_SUCCESS, 18),
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (NVML_SUCCESS, 0),
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (NVML_SUCCESS, 0),
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (NVML_SUCCESS, 0),
    }
    gpu.fabric = {
        "clusterUuid": CLUSTER_UUID,
        "status": NVML_SUCCESS,
        "cliqueId": 3,
        "state": NVML_GPU_FABRIC_STATE_COMPLETED,
        "healthMask": 0,
    }
    return gpu


def older_gpu(index: int = 0) -> FakeGpu:
    return FakeGpu(
        index=index,
        temperature=52,
        power_mw=150_500,
        clocks_mask=0x4,  # sw_power_cap
        remapped_rows=None,
        retired_pages=([0x1F000], []),
        retired_pending=0,
        pcie_replay=2,
        links={n: {"state": 1, "replay": 0, "recovery": 0, "crc_flit": n, "crc_data": 0} for n in range(6)},
        fabric=None,
    )


PROFILES = {"h200": h200_gpu, "blackwell": blackwell_gpu, "older": older_gpu}


class FakeNvml(types.ModuleType):
    """The module: ``FakeNvml("h200", gpus=4)``."""

    def __init__(self, profile: str = "h200", gpus: int = 1) -> None:
        super().__init__("pynvml")
        self.__dict__.update(
            {name: value for name, value in globals().items() if name.startswith(("NVML", "nvml", "c_nvml"))}
        )
        self.gpus = [PROFILES[profile](i) for i in range(gpus)]
        self.calls: Counter[str] = Counter()
        self.events: list[tuple[int, int]] = []  # (GPU index, XID)
        if profile == "older":
            # An nvidia-ml-py from before these names (12.535 and 12.550).
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfoV"):
                setattr(self, name, None)

    def _gpu(self, name: str, handle: FakeGpu) -> FakeGpu:
        self.calls[name] += 1
        if handle.lost or handle.lose_on == name:
            handle.lost = True
            raise NVMLError_GpuIsLost()
        if name in handle.failing:
            raise handle.failing[name]
        return handle

    @staticmethod
    def _answer(value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported()
        return value

    # --- library and handles
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return handle.index

    # --- XID events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, kinds: int, event_set: str) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise NVMLError_Timeout()
        index, xid = self.events.pop(0)
        return types.SimpleNamespace(device=self.gpus[index], eventData=xid)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    # --- signals
    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return self._answer(self._gpu("nvmlDeviceGetTemperature", handle).temperature)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._answer(self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_mask)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_mask)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, error_type: int, counter_type: int) -> int:
        ecc = self._answer(self._gpu("nvmlDeviceGetTotalEccErrors", handle).ecc)
        counter = ("volatile", "aggregate")[counter_type]
        return ecc[f"{counter}_{('corrected', 'uncorrected')[error_type]}"]

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        return self._answer(self._gpu("nvmlDeviceGetRemappedRows", handle).remapped_rows)

    def nvmlDeviceGetRetiredPages(self, handle: FakeGpu, cause: int) -> list[int]:
        return list(self._answer(self._gpu("nvmlDeviceGetRetiredPages", handle).retired_pages)[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu) -> int:
        return self._answer(self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pending)

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeGpu) -> int:
        return self._answer(self._gpu("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay)

    def _link(self, name: str, handle: FakeGpu, link: int) -> dict[str, int]:
        gpu = self._gpu(name, handle)
        if not 0 <= link < NVML_NVLINK_MAX_LINKS:
            raise NVMLError_InvalidArgument()
        return self._answer((gpu.links or {}).get(link))

    def nvmlDeviceGetNvLinkState(self, handle: FakeGpu, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkState", handle, link)["state"]

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeGpu, link: int, counter: int) -> int:
        entry = self._link("nvmlDeviceGetNvLinkErrorCounter", handle, link)
        return entry[("replay", "recovery", "crc_flit", "crc_data")[counter]]

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[int]) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        out = []
        for field_id in field_ids:
            ret, value = gpu.fields.get(field_id, (NVML_ERROR_NOT_SUPPORTED, 0))
            # The link count is an unsigned int, the counters unsigned long longs: the
            # agent must read the union member valueType names.
            kind = NVML_VALUE_TYPE_UNSIGNED_INT if field_id == NVML_FI_DEV_NVLINK_LINK_COUNT else 3
            member = "uiVal" if kind == NVML_VALUE_TYPE_UNSIGNED_INT else "ullVal"
            out.append(
                types.SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=ret,
                    valueType=kind,
                    value=types.SimpleNamespace(**{member: value}),
                )
            )
        return out

    def _fill_fabric(self, gpu: FakeGpu, info: Any) -> int:
        fabric = self._answer(gpu.fabric)
        info.clusterUuid[:] = list(fabric.get("clusterUuid", bytes(16)))
        info.status, info.cliqueId, info.state = fabric["status"], fabric.get("cliqueId", 0), fabric["state"]
        if hasattr(info, "healthMask"):
            info.healthMask = fabric.get("healthMask", 0)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, device: FakeGpu, gpuFabricInfo: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", device)
        info = gpuFabricInfo._obj  # passed by reference, as NVML needs it
        if info.version not in gpu.fabric_versions:
            raise NVMLError_ArgumentVersionMismatch()
        return self._fill_fabric(gpu, info)

    def nvmlDeviceGetGpuFabricInfo(self, device: FakeGpu, gpuFabricInfo: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfo", device)
        return self._fill_fabric(gpu, gpuFabricInfo._obj)
