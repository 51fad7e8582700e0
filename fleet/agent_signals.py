"""The health signals the node agent (``fleet.agent``) sends for each GPU, read
through NVML, and the node's IMEX daemon status. Standard library only, like the
agent: this runs on GPU hosts and must never import Django.

What one GPU's ``signals`` may hold, each read in its own try so that one call the
GPU does not support never hides the others:

    power_w              nvmlDeviceGetPowerUsage (mW), in watts
    clock_event_reasons  nvmlDeviceGetCurrentClocksEventReasons (or ...ThrottleReasons), the set bits by name
    ecc                  nvmlDeviceGetTotalEccErrors: volatile/aggregate x corrected/uncorrected
    remapped_rows        nvmlDeviceGetRemappedRows (Ampere and later)
    retired_pages        nvmlDeviceGetRetiredPages(+PendingStatus), only where rows are not remapped
    pcie_replay_count    nvmlDeviceGetPcieReplayCounter
    nvlink               per link (state and error counters), else the NVLink field values
    fabric               nvmlDeviceGetGpuFabricInfoV (else ...GpuFabricInfo): cluster UUID, clique, state

Counters are sent as NVML gives them (cumulative; the server computes rates and
notices resets). A signal the GPU does not support is named in ``unsupported``
(keys in ``SIGNALS``) and is not asked again for ``reprobe_s`` seconds: NVML
answers "Not Supported" the same way every time, and on an H200 the 36 per-link
NVLink calls alone would cost ~0.4 ms a heartbeat for nothing.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The keys of ``unsupported``, in the order they are read.
SIGNALS = (
    "power_w",
    "clock_event_reasons",
    "ecc",
    "remapped_rows",
    "retired_pages",
    "pcie_replay_count",
    "nvlink_links",
    "nvlink_fields",
    "fabric",
)
REPROBE_S = 600.0  # how long an unsupported call is believed before it is asked again

# nvmlClocksEventReason* bits (the same values as the older ...ThrottleReason*).
CLOCK_EVENT_REASONS = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# (name in the heartbeat, pynvml constant)
NVLINK_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
)
NVLINK_FIELDS = (
    ("link_count", "NVML_FI_DEV_NVLINK_LINK_COUNT"),
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
)
# c_nvmlFieldValue_t.valueType -> the member of its value union that holds it
_FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_PAGE_SINGLE_BIT, _PAGE_DOUBLE_BIT = 0, 1  # NVML_PAGE_RETIREMENT_CAUSE_*
MAX_ERROR_CHARS = 300  # the server keeps 500; leave room for the temperature's own error


def decode_clock_event_reasons(mask: int) -> list[str]:
    """The names of the set bits of an NVML clock-event (throttle) reason mask."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


class _Unsupported(Exception):
    """This GPU (or this pynvml) cannot give the signal."""


class _GpuLost(Exception):
    """NVML said the GPU is lost: every further call on it would fail too."""


@dataclass
class GpuSignals:
    signals: dict[str, Any] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lost: bool = False  # NVML said the GPU is lost; the signals after that one were not read

    @property
    def error(self) -> str:
        text = "; ".join(self.errors)
        return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass
class _LinkProbe:
    """Which NVLink links and counters a GPU has, as found at ``when``."""

    when: float
    links: list[int]
    counters: list[tuple[str, int]]


class NvmlSignalReader:
    """Reads every signal of one GPU handle. ``nvml`` is the pynvml module (or a
    fake with the same names); ``clock`` is injectable so tests need no sleeps."""

    def __init__(self, nvml: Any, reprobe_s: float = REPROBE_S, clock: Callable[[], float] = time.monotonic):
        self._nvml, self._reprobe_s, self._clock = nvml, reprobe_s, clock
        self._not_supported = tuple(
            cls
            for cls in (
                getattr(nvml, "NVMLError_NotSupported", None),
                getattr(nvml, "NVMLError_FunctionNotFound", None),
            )
            if cls is not None
        )
        self._version_mismatch = getattr(nvml, "NVMLError_ArgumentVersionMismatch", None) or _Unsupported
        # (GPU index, signal) -> when NVML last said it is not supported
        self._unsupported_at: dict[tuple[int, str], float] = {}
        self._links: dict[int, _LinkProbe] = {}
        self._fabric_struct: Any = None  # the fabric info struct this driver accepted
        self._return_words = {
            getattr(nvml, name): name.removeprefix("NVML_ERROR_").lower()
            for name in dir(nvml)
            if name.startswith("NVML_ERROR_") and isinstance(getattr(nvml, name), int)
        }
        self._return_words[getattr(nvml, "NVML_SUCCESS", 0)] = "success"

    def _fn(self, *names: str) -> Callable[..., Any]:
        """The first of these pynvml functions this pynvml has (older ones lack the newer names)."""
        for name in names:
            fn = getattr(self._nvml, name, None)
            if fn is not None:
                return fn
        raise _Unsupported(f"pynvml has no {names[0]}")

    def read(self, index: int, handle: Any) -> GpuSignals:
        """All signals of one GPU. When NVML says the GPU is lost, the reading
        stops there (every further call would fail the same way) with ``lost`` set."""
        out = GpuSignals()
        try:
            self._read(index, handle, out, self._clock())
        except _GpuLost:
            out.lost = True
        return out

    def _read(self, index: int, handle: Any, out: GpuSignals, now: float) -> None:
        signals, attempt = out.signals, self._attempt
        for key, reader in (
            ("power_w", self._power),
            ("clock_event_reasons", self._clock_events),
            ("ecc", self._ecc),
            ("remapped_rows", self._remapped_rows),
        ):
            value = attempt(index, key, reader, handle, out, now)
            if value is not None:
                signals[key] = value
        # Row remapping replaced page retirement (Ampere): ask for retired pages
        # only where rows are not remapped. An H200 answers "Not Supported" anyway.
        if "remapped_rows" in signals:
            out.unsupported.append("retired_pages")
        elif "remapped_rows" in out.unsupported:
            value = attempt(index, "retired_pages", self._retired_pages, handle, out, now)
            if value is not None:
                signals["retired_pages"] = value
        value = attempt(index, "pcie_replay_count", self._pcie_replay, handle, out, now)
        if value is not None:
            signals["pcie_replay_count"] = value
        # Per-link NVLink counters where the GPU has them (Hopper on HGX); the
        # all-links totals in field values where it does not (Blackwell).
        links = attempt(index, "nvlink_links", self._nvlink_links, handle, out, now)
        if links is not None:
            signals["nvlink"] = {"source": "links", "links": links}
        elif "nvlink_links" in out.unsupported:
            totals = attempt(index, "nvlink_fields", self._nvlink_fields, handle, out, now)
            if totals is not None:
                signals["nvlink"] = {"source": "fields", **totals}
        value = attempt(index, "fabric", self._fabric, handle, out, now)
        if value is not None:
            signals["fabric"] = value

    def _attempt(
        self,
        index: int,
        key: str,
        reader: Callable[[int, Any, float], Any],
        handle: Any,
        out: GpuSignals,
        now: float,
    ) -> Any:
        """One signal: its value, or None with the key in ``unsupported`` or the
        failure in ``errors``."""
        nvml = self._nvml
        since = self._unsupported_at.get((index, key))
        if since is not None and now - since < self._reprobe_s:
            out.unsupported.append(key)
            return None
        try:
            value = reader(index, handle, now)
        except nvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost(key) from exc
        except (_Unsupported, *self._not_supported):
            self._unsupported_at[(index, key)] = now
            out.unsupported.append(key)
            return None
        except nvml.NVMLError as exc:
            out.errors.append(f"{key}: {exc}")
            return None
        self._unsupported_at.pop((index, key), None)
        return value

    # --- one reader per signal: (index, handle, now) -> value ------------------------

    def _power(self, index: int, handle: Any, now: float) -> float:
        return round(self._fn("nvmlDeviceGetPowerUsage")(handle) / 1000.0, 1)

    def _clock_events(self, index: int, handle: Any, now: float) -> list[str]:
        fn = self._fn("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        return decode_clock_event_reasons(int(fn(handle)))

    def _ecc(self, index: int, handle: Any, now: float) -> dict[str, int]:
        nvml, fn = self._nvml, self._fn("nvmlDeviceGetTotalEccErrors")
        out = {}
        for counter, counter_type in (
            ("volatile", nvml.NVML_VOLATILE_ECC),
            ("aggregate", nvml.NVML_AGGREGATE_ECC),
        ):
            for kind, error_type in (
                ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                out[f"{counter}_{kind}"] = int(fn(handle, error_type, counter_type))
        return out

    def _remapped_rows(self, index: int, handle: Any, now: float) -> dict[str, Any]:
        correctable, uncorrectable, pending, failure = self._fn("nvmlDeviceGetRemappedRows")(handle)
        return {
            "correctable": int(correctable),
            "uncorrectable": int(uncorrectable),
            "pending": bool(pending),
            "failure": bool(failure),
        }

    def _retired_pages(self, index: int, handle: Any, now: float) -> dict[str, Any]:
        fn = self._fn("nvmlDeviceGetRetiredPages")
        return {
            "single_bit": len(fn(handle, _PAGE_SINGLE_BIT)),
            "double_bit": len(fn(handle, _PAGE_DOUBLE_BIT)),
            "pending": bool(self._fn("nvmlDeviceGetRetiredPagesPendingStatus")(handle)),
        }

    def _pcie_replay(self, index: int, handle: Any, now: float) -> int:
        return int(self._fn("nvmlDeviceGetPcieReplayCounter")(handle))

    def _probe_links(self, handle: Any, now: float) -> _LinkProbe:
        """Which links answer, and which error counters they have. The first call
        on a link the GPU lacks is "Not Supported" (or "Invalid Argument" past its
        last link); asking again every heartbeat would cost 10 us a link."""
        nvml = self._nvml
        state_fn = self._fn("nvmlDeviceGetNvLinkState")
        absent = (*self._not_supported, getattr(nvml, "NVMLError_InvalidArgument", _Unsupported))
        links = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state_fn(handle, link)
            except absent:
                continue
            links.append(link)
        counters = []
        if links:
            counter_fn = self._fn("nvmlDeviceGetNvLinkErrorCounter")
            for name, constant in NVLINK_COUNTERS:
                if not hasattr(nvml, constant):
                    continue
                try:
                    counter_fn(handle, links[0], getattr(nvml, constant))
                except self._not_supported:
                    continue
                counters.append((name, getattr(nvml, constant)))
        return _LinkProbe(now, links, counters)

    def _nvlink_links(self, index: int, handle: Any, now: float) -> list[dict[str, Any]]:
        probe = self._links.get(index)
        if probe is None or now - probe.when >= self._reprobe_s:
            probe = self._links[index] = self._probe_links(handle, now)
        if not probe.links:
            raise _Unsupported("no NVLink link answers")
        nvml = self._nvml
        state_fn, counter_fn = nvml.nvmlDeviceGetNvLinkState, nvml.nvmlDeviceGetNvLinkErrorCounter
        active = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        out = []
        for link in probe.links:
            entry: dict[str, Any] = {"link": link, "active": state_fn(handle, link) == active}
            for name, constant in probe.counters:
                entry[name] = int(counter_fn(handle, link, constant))
            out.append(entry)
        return out

    def _nvlink_fields(self, index: int, handle: Any, now: float) -> dict[str, int]:
        """The NVLink totals from field values. A field whose own nvmlReturn is
        not success is left out; none answering is unsupported (an H200 without
        NVLink peers answers "Not Supported" in each)."""
        nvml = self._nvml
        wanted = [
            (name, getattr(nvml, constant)) for name, constant in NVLINK_FIELDS if hasattr(nvml, constant)
        ]
        values = self._fn("nvmlDeviceGetFieldValues")(handle, [field_id for _, field_id in wanted])
        success = getattr(nvml, "NVML_SUCCESS", 0)
        out = {}
        for (name, _), value in zip(wanted, values, strict=True):
            if value.nvmlReturn == success:
                out[name] = int(getattr(value.value, _FIELD_VALUE_MEMBERS.get(value.valueType, "ullVal")))
        if not out:
            raise _Unsupported("no NVLink field answers")
        return out

    def _fabric(self, index: int, handle: Any, now: float) -> dict[str, Any]:
        """Fabric info, through the versioned call with the newest struct this
        driver accepts (it must be passed in, by reference, with its version set),
        else the older unversioned call."""
        nvml = self._nvml
        call_v: Callable[..., Any] | None = getattr(nvml, "nvmlDeviceGetGpuFabricInfoV", None)
        structs = [
            getattr(nvml, name)
            for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")
            if hasattr(nvml, name) and call_v is not None
        ]
        if self._fabric_struct is not None:
            structs = [self._fabric_struct]
        for struct in structs:
            assert call_v is not None
            info = struct()
            try:
                call_v(handle, ctypes.byref(info))
            except self._version_mismatch:
                continue  # an older driver: try the older struct
            except self._not_supported:
                break  # this driver has no versioned call: try the unversioned one
            self._fabric_struct = struct
            return self._fabric_payload(info)
        info = self._fn("c_nvmlGpuFabricInfo_t")()
        self._fn("nvmlDeviceGetGpuFabricInfo")(handle, ctypes.byref(info))
        return self._fabric_payload(info)

    def _fabric_payload(self, info: Any) -> dict[str, Any]:
        raw = bytes(info.clusterUuid)
        return {
            # null until the fabric manager has put the GPU in a cluster
            "cluster_uuid": str(uuid.UUID(bytes=raw)) if any(raw) else None,
            "clique_id": int(info.cliqueId),
            "state": FABRIC_STATES.get(int(info.state), f"unknown_{int(info.state)}"),
            "status": self._return_words.get(int(info.status), f"error_{int(info.status)}"),
            "health_mask": int(info.healthMask) if hasattr(info, "healthMask") else None,
        }


SIMULATED_TROUBLE = ("ecc", "remap", "nvlink", "thermal")


class SimulatedSignals:
    """The signals of ``count`` healthy GB200 GPUs for ``fleet.agent.SimulatedGpus``:
    counters that rise slowly, as real ones do, unless ``trouble`` (GPU index -> one
    of ``SIMULATED_TROUBLE``) says otherwise."""

    UNSUPPORTED = ["retired_pages", "nvlink_links"]  # as on Blackwell

    def __init__(self, count: int, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self.trouble: dict[int, str] = {}
        self._cluster_uuid = str(uuid.UUID(int=self._rng.getrandbits(128)))
        self._counters = [
            {"ecc": 0, "ecc_before": self._rng.randint(0, 20), "pcie": self._rng.randint(0, 3), "unc": 0}
            | {"crc_flit": 0, "replay": 0, "recovery": 0}
            for _ in range(count)
        ]

    def read(self, index: int, temp: float) -> dict[str, Any]:
        rng, c, trouble = self._rng, self._counters[index], self.trouble.get(index)
        # Healthy hardware too sees a corrected ECC error or a PCIe replay now and then.
        c["ecc"] += rng.random() < 0.02
        c["pcie"] += rng.random() < 0.01
        if trouble == "ecc":
            c["ecc"] += rng.randint(20, 60)
        if trouble == "remap":
            c["unc"] = max(c["unc"], 1)
        if trouble == "nvlink":
            c["crc_flit"] += rng.randint(100, 500)
            c["replay"] += rng.randint(1, 10)
            c["recovery"] += rng.random() < 0.2
        power = round(90.0 + (temp - 35.0) * 14.0 + rng.uniform(-5.0, 5.0), 1)
        reasons = ["gpu_idle"] if power < 200 else []
        if trouble == "thermal":
            reasons = ["sw_thermal_slowdown", "hw_thermal_slowdown"]
        return {
            "power_w": power,
            "clock_event_reasons": reasons,
            "ecc": {
                "volatile_corrected": c["ecc"],
                "volatile_uncorrected": c["unc"],
                "aggregate_corrected": c["ecc_before"] + c["ecc"],
                "aggregate_uncorrected": c["unc"],
            },
            "remapped_rows": {
                "correctable": 0,
                "uncorrectable": c["unc"],
                "pending": trouble == "remap",
                "failure": False,
            },
            "pcie_replay_count": c["pcie"],
            "nvlink": {
                "source": "fields",
                "link_count": 18,
                "crc_flit": c["crc_flit"],
                "replay": c["replay"],
                "recovery": c["recovery"],
            },
            "fabric": {
                "cluster_uuid": self._cluster_uuid,
                "clique_id": 1,
                "state": "completed",
                "status": "success",
                "health_mask": 0,
            },
        }


# --- IMEX (node level) -----------------------------------------------------------------

IMEX_CTL = "nvidia-imex-ctl"
IMEX_TIMEOUT_S = 2.0


def read_imex_status(timeout: float = IMEX_TIMEOUT_S) -> dict[str, str]:
    """The local IMEX daemon's status from ``nvidia-imex-ctl -q``, which prints
    one word: READY, or the state it is still in (INITIALIZING, WAITING_FOR_PEERS,
    INIT_GPU, ...), or UNAVAILABLE. No binary on PATH is "unsupported" (not an
    NVLink-fabric node); a binary that fails, prints nothing or outlives
    ``timeout`` (it is then killed) is "unavailable"."""
    binary = shutil.which(IMEX_CTL)
    if binary is None:
        return {"status": "unsupported", "detail": f"{IMEX_CTL} is not on PATH"}
    try:
        result = subprocess.run(
            [binary, "-q"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return {"status": "unavailable", "detail": f"{IMEX_CTL} -q did not answer within {timeout:g}s"}
    except OSError as exc:
        return {"status": "unavailable", "detail": f"{IMEX_CTL}: {exc}"[:200]}
    words = result.stdout.split()
    word = words[0].upper() if words else ""
    if result.returncode != 0 or not word:
        problem = (result.stderr or result.stdout).strip().splitlines()
        detail = problem[0] if problem else f"exit status {result.returncode}"
        return {"status": "unavailable", "detail": f"{IMEX_CTL} -q: {detail}"[:200]}
    if word == "READY":
        return {"status": "ready", "detail": word}
    if word == "UNAVAILABLE":
        return {"status": "unavailable", "detail": word}
    return {"status": "not_ready", "detail": word[:200]}
