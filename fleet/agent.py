"""The Rackwise node agent: reports this host's GPU health to Rackwise.

Runs on GPU hosts, so it uses only the standard library, plus ``pynvml`` (from the
``nvidia-ml-py`` package) when it is installed. It must never import Django.

    python -m fleet.agent --server https://rackwise.example.com --token 12.s3cr3t
    python -m fleet.agent --server http://127.0.0.1:8000 --token "$T" --simulate --fail-after 20

GPU health comes from, in order of preference: NVML (temperatures, XID events and
every other health signal the GPU supports), ``nvidia-smi`` (temperatures, and
GPUs that have disappeared; it cannot see XIDs or the other signals), or
``--simulate`` (GB200-like signals; ``--trouble GPU:KIND`` for demos). The token
is the one printed by ``manage.py create_agent_token HOSTNAME`` (or
``POST /api/nodes/<id>/agent-token/``); it starts with the node id.

When the server cannot be reached the agent keeps going with exponential backoff
and jitter, one log line per failure, and keeps the XIDs it saw until a heartbeat
delivers them. A refused token (HTTP 401/403) or a refused payload (other 4xx)
will not get better by retrying, so it exits non-zero with one line.

Each GPU entry of a heartbeat holds ``index``, ``state`` (ok, degraded, failed),
``xids``, ``temperature_c``, an optional short ``error``, and::

    "signals": {"power_w": 80.7, "clock_event_reasons": ["gpu_idle"],
                "ecc": {"volatile_corrected": 0, "volatile_uncorrected": 0,
                        "aggregate_corrected": 0, "aggregate_uncorrected": 0},
                "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": false},
                "pcie_replay_count": 0,
                "nvlink": {"source": "links", "links": [{"link": 0, "active": true, "replay": 0,
                           "recovery": 0, "crc_flit": 0, "crc_data": 0}, ...]}
                       or {"source": "fields", "link_count": 18, "crc_flit": 0, "replay": 0, "recovery": 0},
                "fabric": {"cluster_uuid": "...", "clique_id": 3, "state": "completed",
                           "status": "success", "health_mask": 0}},
    "unsupported": ["retired_pages", "nvlink_links", "nvlink_fields"]

A signal the GPU does not support is absent from ``signals`` and named in
``unsupported`` (keys: ``fleet.agent_signals.SIGNALS``); one that failed otherwise
is absent and named in ``error``, without changing ``state``. Counters are sent
as NVML gives them (cumulative; the server computes rates and sees resets).
Retired pages are read only where rows are not remapped (before Ampere). The
heartbeat also carries ``"imex": {"status": "ready" | "not_ready" |
"unavailable" | "unsupported", "detail": ...}`` from ``nvidia-imex-ctl -q``
(2 s timeout; "unsupported" where it is not installed).

Exit codes: 0 done (``--once``/``--count``) or stopped by a signal; 1 gave up after
``--max-attempts`` failed attempts; 2 bad arguments or no GPU source; 3 token
refused; 4 heartbeat refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.agent_signals import (
    REPROBE_S,
    SIGNALS,
    SIMULATED_TROUBLE,
    NvmlSignalReader,
    SimulatedSignals,
    read_imex_status,
)

VERSION = "0.1.0"
EXIT_OK, EXIT_GAVE_UP, EXIT_USAGE, EXIT_TOKEN_REFUSED, EXIT_REFUSED = 0, 1, 2, 3, 4
XID_FELL_OFF_THE_BUS = 79
GPU_LOST = "NVML: GPU is lost (fell off the bus)"

log = logging.getLogger("rackwise-agent")


class Fatal(Exception):
    """Retrying cannot help; exit with ``code`` and this one-line message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Retryable(Exception):
    """The server is down, slow or briefly unhappy; try again later."""


# --- GPU sources ----------------------------------------------------------------------


@dataclass
class GpuReading:
    index: int
    state: str = "ok"  # ok | degraded | failed
    xids: list[int] = field(default_factory=list)
    temperature_c: float | None = None
    error: str = ""
    # The other health signals (see fleet.agent_signals), and the names of those
    # this GPU or source cannot give. None: the source does not report them at all.
    signals: dict[str, Any] | None = None
    unsupported: list[str] | None = None

    def as_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "state": self.state,
            "xids": self.xids,
            "temperature_c": self.temperature_c,
        }
        if self.error:
            out["error"] = self.error
        if self.signals is not None:
            out["signals"] = self.signals
        if self.unsupported is not None:
            out["unsupported"] = self.unsupported
        return out


class GpuSource(Protocol):
    name: str

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


class SimulatedGpus:
    """``count`` GPUs of a GB200-like tray, for demos and tests: temperatures that
    wander between 35 and 85 C, and the signals NVML gives there (NVLink totals from
    field values, fabric completed; no per-link counters, no retired pages), with
    counters that rise slowly as healthy hardware's do. With ``fail_after`` N, GPU 0
    reports XID 79 (fell off the bus) on read N + 1 and stays failed.

    ``trouble`` maps a GPU index to one of ``SIMULATED_TROUBLE``: ``ecc`` (corrected
    ECC errors climbing fast), ``remap`` (an uncorrectable error, a row remap
    pending), ``nvlink`` (CRC and replay errors climbing), ``thermal`` (thermal
    slowdown). It may be changed between reads."""

    name = "simulate"

    def __init__(
        self,
        count: int,
        fail_after: int | None = None,
        seed: int | None = None,
        trouble: dict[int, str] | None = None,
    ) -> None:
        self._rng = random.Random(seed)
        self._temps = [self._rng.uniform(40.0, 60.0) for _ in range(count)]
        self._fail_after = fail_after
        self._reads = 0
        # Its own generator, so that the temperatures a seed gives stay as they were.
        self._signals = SimulatedSignals(count, None if seed is None else seed + 1)
        self.trouble = self._signals.trouble
        self.trouble.update(trouble or {})

    def read(self) -> list[GpuReading]:
        self._reads += 1
        readings = []
        for i, temp in enumerate(self._temps):
            self._temps[i] = min(85.0, max(35.0, temp + self._rng.uniform(-2.0, 2.0)))
            readings.append(
                GpuReading(
                    index=i,
                    temperature_c=round(self._temps[i], 1),
                    signals=self._signals.read(i, self._temps[i]),
                    unsupported=list(SimulatedSignals.UNSUPPORTED),
                )
            )
        if self._fail_after is not None and self._reads > self._fail_after and readings:
            gpu = readings[0]
            gpu.state, gpu.temperature_c, gpu.signals, gpu.unsupported = "failed", None, {}, []
            # XIDs are events: reported once, on the read where the fault happens.
            if self._reads == self._fail_after + 1:
                gpu.xids = [XID_FELL_OFF_THE_BUS]
        return readings

    def read_imex(self) -> dict[str, str]:
        return {"status": "ready", "detail": "READY (simulated)"}

    def close(self) -> None:
        pass


class NvmlGpus:
    """Temperatures, XID events and every other health signal the GPU supports
    (``fleet.agent_signals``) through NVML. Events are drained without waiting
    (``nvmlEventSetWait`` with a 0 ms timeout) once per read. A call a GPU does not
    support is asked again only every ``reprobe_s`` seconds (and on restart)."""

    name = "nvml"

    def __init__(self, reprobe_s: float = REPROBE_S, clock: Callable[[], float] = time.monotonic) -> None:
        import pynvml  # optional dependency: nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._signals = NvmlSignalReader(pynvml, reprobe_s=reprobe_s, clock=clock)
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._indices = [pynvml.nvmlDeviceGetIndex(h) for h in self._handles]
        self._events = pynvml.nvmlEventSetCreate()
        for index, handle in zip(self._indices, self._handles, strict=True):
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            except pynvml.NVMLError as exc:
                # Some GPUs (or containers without the right capabilities) cannot
                # deliver XID events; temperatures still work.
                log.warning("GPU %s: XID events unavailable (%s); reporting temperatures only", index, exc)

    def _drain_xids(self) -> dict[int, list[int]]:
        nvml, xids = self._nvml, dict[int, list[int]]()
        while True:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return xids
            except nvml.NVMLError as exc:
                log.warning("reading XID events failed: %s", exc)
                return xids
            try:
                index = nvml.nvmlDeviceGetIndex(event.device)
            except nvml.NVMLError:
                continue
            xids.setdefault(index, []).append(int(event.eventData))

    def read(self) -> list[GpuReading]:
        nvml, xids = self._nvml, self._drain_xids()
        readings = []
        for index, handle in zip(self._indices, self._handles, strict=True):
            reading = GpuReading(index=index, xids=xids.get(index, []))
            try:
                reading.temperature_c = float(
                    nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                )
            except nvml.NVMLError_GpuIsLost:
                reading.state, reading.error = "failed", GPU_LOST
            except nvml.NVMLError as exc:
                reading.state, reading.error = "degraded", f"NVML: {exc}"
            self._read_signals(reading, handle)
            if reading.xids and reading.state == "ok":
                reading.state = "degraded"  # the server escalates fatal XIDs to failed
            readings.append(reading)
        return readings

    def _read_signals(self, reading: GpuReading, handle: Any) -> None:
        """The other signals. A signal that fails for another reason than "not
        supported" is named in the error text but does not change the GPU's state:
        the server judges the counters, and a refused ECC query (a container
        without the capability, say) is not a sick GPU."""
        if reading.state == "failed":
            reading.signals, reading.unsupported = {}, []
            return
        found = self._signals.read(reading.index, handle)
        reading.signals, reading.unsupported = found.signals, found.unsupported
        if found.lost:
            reading.state, reading.temperature_c = "failed", None
        problems = [GPU_LOST] if found.lost else []
        if found.errors:
            problems.append(f"NVML: {found.error}")
        reading.error = "; ".join(p for p in (reading.error, *problems) if p)

    def close(self) -> None:
        try:
            self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


SMI_QUERY = "index,temperature.gpu,pci.bus_id"


def parse_nvidia_smi(text: str) -> list[GpuReading]:
    """Parse ``nvidia-smi --query-gpu=index,temperature.gpu,pci.bus_id
    --format=csv,noheader,nounits``. A GPU whose fields read ``[GPU requires
    reset]`` or ``Unknown Error`` is failed; ``[N/A]`` is just unknown."""
    readings = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if not fields or not fields[0].isdigit():
            continue
        reading = GpuReading(index=int(fields[0]))
        broken = [f for f in fields[1:] if "requires reset" in f.lower() or "unknown error" in f.lower()]
        if broken:
            reading.state, reading.error = "failed", f"nvidia-smi: {broken[0]}"
        elif len(fields) > 1:
            try:
                reading.temperature_c = float(fields[1])
            except ValueError:
                pass  # [N/A] or [Not Supported]
        readings.append(reading)
    return readings


class NvidiaSmiGpus:
    """Health from ``nvidia-smi``. It cannot report XIDs, but a GPU that was listed
    before and is missing now has fallen off the bus as far as anyone can tell."""

    name = "nvidia-smi"

    def __init__(self, binary: str) -> None:
        self._binary = binary
        self._seen: set[int] = set()

    def read(self) -> list[GpuReading]:
        try:
            result = subprocess.run(
                [self._binary, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            readings = parse_nvidia_smi(result.stdout)
            problem = "" if result.returncode == 0 else (result.stderr or result.stdout).strip()[:200]
        except (OSError, subprocess.TimeoutExpired) as exc:
            readings, problem = [], str(exc)
        present = {r.index for r in readings}
        for index in sorted(self._seen - present):
            readings.append(
                GpuReading(index=index, state="failed", error=f"missing from nvidia-smi {problem}".strip())
            )
        self._seen |= present
        for reading in readings:
            # Temperature only: say so, so that no one reads silence as "no errors".
            reading.signals, reading.unsupported = {}, list(SIGNALS)
        return sorted(readings, key=lambda r: r.index)

    def close(self) -> None:
        pass


def open_source(args: argparse.Namespace) -> GpuSource:
    """The best GPU source available, or Fatal(EXIT_USAGE) when there is none."""
    if args.simulate:
        return SimulatedGpus(args.gpus, args.fail_after, args.seed, trouble=args.trouble)
    problems = []
    try:
        return NvmlGpus()
    except ImportError:
        problems.append("pynvml is not installed (pip install nvidia-ml-py)")
    except Exception as exc:  # pynvml raises NVMLError subclasses, e.g. no driver
        problems.append(f"NVML: {exc}")
    binary = shutil.which("nvidia-smi")
    if binary:
        return NvidiaSmiGpus(binary)
    problems.append("nvidia-smi is not on PATH")
    raise Fatal(EXIT_USAGE, f"no GPU source: {'; '.join(problems)}; or use --simulate")


# --- talking to the server ------------------------------------------------------------


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read().decode() or "null")
    except (ValueError, OSError):
        return error.reason or ""
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return json.dumps(body)[:300]


@dataclass
class Client:
    server: str
    token: str
    node_id: int
    timeout: float = 10.0

    @property
    def url(self) -> str:
        return f"{self.server.rstrip('/')}/api/nodes/{self.node_id}/heartbeat/"

    def send(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST one heartbeat. Raises Retryable or Fatal."""
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={
                "Authorization": f"Agent {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": f"rackwise-agent/{VERSION}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode() or "{}")
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code in (401, 403):
                raise Fatal(
                    EXIT_TOKEN_REFUSED, f"server refused the token (HTTP {exc.code}): {detail}"
                ) from exc
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                raise Fatal(
                    EXIT_REFUSED, f"server refused the heartbeat (HTTP {exc.code}): {detail}"
                ) from exc
            raise Retryable(f"HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # ValueError: a reply that is not JSON (a proxy's error page, say).
            reason = getattr(exc, "reason", exc)
            raise Retryable(str(reason) or exc.__class__.__name__) from exc


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: between half and all of
    ``min(cap, base * 2**(failures-1))``. The jitter spreads out the reconnects of
    a whole fleet of agents after a server restart."""
    ceiling = min(cap, base * 2 ** max(failures - 1, 0))
    return rng.uniform(ceiling / 2, ceiling)


@dataclass
class Agent:
    """The heartbeat loop, split into single steps so each can be tested."""

    client: Client
    source: GpuSource
    interval: float
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    max_attempts: int = 0  # consecutive failures before giving up; 0 = never
    count: int = 0  # heartbeats to deliver before exiting; 0 = forever
    rng: random.Random = field(default_factory=random.Random)
    stop: threading.Event = field(default_factory=threading.Event)
    delivered: int = 0
    failures: int = 0
    # XIDs seen but not yet delivered, by GPU index: a heartbeat that fails must
    # not lose the event that explains a failure.
    pending_xids: dict[int, list[int]] = field(default_factory=dict)
    # The node's IMEX daemon status ({"status", "detail"}), read once per heartbeat.
    imex: Callable[[], dict[str, str]] = read_imex_status

    def payload(self) -> dict[str, Any]:
        readings = self.source.read()
        for reading in readings:
            self.pending_xids.setdefault(reading.index, []).extend(reading.xids)
            reading.xids = list(self.pending_xids[reading.index])
        return {"agent_version": VERSION, "gpus": [r.as_payload() for r in readings], "imex": self.imex()}

    def beat(self) -> float:
        """Send one heartbeat; return how long to wait before the next one.
        Raises Fatal when retrying cannot help or attempts are exhausted."""
        try:
            result = self.client.send(self.payload())
        except Retryable as exc:
            self.failures += 1
            if self.max_attempts and self.failures >= self.max_attempts:
                raise Fatal(EXIT_GAVE_UP, f"gave up after {self.failures} failed attempt(s): {exc}") from exc
            delay = backoff_delay(self.failures, self.backoff_base, self.backoff_cap, self.rng)
            log.warning("heartbeat failed (attempt %d): %s; retrying in %.2fs", self.failures, exc, delay)
            return delay
        self.pending_xids.clear()
        if self.failures:
            log.info("heartbeat delivered after %d failed attempts", self.failures)
        self.failures = 0
        self.delivered += 1
        log.debug("heartbeat %d delivered: %s", self.delivered, json.dumps(result))
        self._report(result)
        return self.interval

    def _report(self, result: dict[str, Any]) -> None:
        host, state = result.get("hostname", f"node {self.client.node_id}"), result.get("node_state", "?")
        for change in result.get("gpus_changed", []):
            log.warning(
                "GPU %s: %s -> %s %s",
                change["index"],
                change["health_before"],
                change["health"],
                change["last_error"],
            )
        if result.get("node_state_before") != state:
            log.warning("node %s is now %s", host, state)
        if self.delivered == 1:
            every = "" if self.count == 1 else f"; sending every {self.interval:g}s"
            log.info("heartbeat accepted: %s is %s (GPU source: %s)%s", host, state, self.source.name, every)

    def run(self) -> int:
        """Beat until stopped, ``count`` heartbeats are delivered, or a Fatal."""
        while not self.stop.is_set():
            delay = self.beat()
            if self.count and self.delivered >= self.count:
                return EXIT_OK
            self.stop.wait(delay)
        return EXIT_OK


# --- command line ---------------------------------------------------------------------


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return parse


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (not the whole usage block), so they stand out in
    journald and in a terminal alike."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="python -m fleet.agent", description="Report this node's GPU health to Rackwise."
    )
    parser.add_argument(
        "--server", required=True, help="Rackwise base URL, e.g. https://rackwise.example.com"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("RACKWISE_AGENT_TOKEN"),
        help="<node_id>.<secret> from create_agent_token (default: $RACKWISE_AGENT_TOKEN)",
    )
    parser.add_argument("--interval", type=_positive(float), default=15.0, help="seconds between heartbeats")
    parser.add_argument("--once", action="store_true", help="send one heartbeat and exit (0 on success)")
    parser.add_argument("--count", type=_positive(int), help="send this many heartbeats, then exit")
    parser.add_argument(
        "--max-attempts",
        type=_positive(int),
        help="give up after this many consecutive failed attempts (default: 1 with --once, else never)",
    )
    parser.add_argument("--backoff-base", type=_positive(float), default=1.0, help="first retry delay (s)")
    parser.add_argument("--backoff-cap", type=_positive(float), default=60.0, help="longest retry delay (s)")
    parser.add_argument("--timeout", type=_positive(float), default=10.0, help="HTTP timeout (s)")
    parser.add_argument("--simulate", action="store_true", help="simulate GPUs instead of reading NVML")
    parser.add_argument("--gpus", type=_positive(int), default=4, help="simulated GPUs (default 4)")
    parser.add_argument(
        "--fail-after", type=int, metavar="N", help="simulated GPU 0 reports XID 79 after N heartbeats"
    )
    parser.add_argument("--seed", type=int, help="seed for simulated temperatures")
    parser.add_argument(
        "--trouble",
        action="append",
        default=[],
        metavar="GPU:KIND",
        help=f"simulated GPU shows trouble, KIND one of {', '.join(SIMULATED_TROUBLE)} (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every heartbeat")
    return parser


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """The arguments and the node id from the token. Exits 2 with one line on a
    bad value (argparse's own errors do the same)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token is required (or set RACKWISE_AGENT_TOKEN)")
    node_part, sep, secret = args.token.partition(".")
    if not (sep and secret and node_part.isdigit()):
        parser.error("--token must look like <node_id>.<secret>, as printed by create_agent_token")
    url = urllib.parse.urlsplit(args.server)
    if url.scheme not in ("http", "https") or not url.netloc:
        parser.error(f"--server must be an http(s) URL, not {args.server!r}")
    if args.fail_after is not None and (not args.simulate or args.fail_after < 0):
        parser.error("--fail-after needs --simulate and a count of 0 or more")
    trouble = {}
    for item in args.trouble:
        gpu, _, kind = item.partition(":")
        if not args.simulate or not gpu.isdigit() or kind not in SIMULATED_TROUBLE:
            parser.error(
                f"--trouble needs --simulate and GPU:KIND, KIND one of {', '.join(SIMULATED_TROUBLE)}"
            )
        trouble[int(gpu)] = kind
    args.trouble = trouble
    if args.once and args.count not in (None, 1):
        parser.error("--once and --count disagree; use one of them")
    return args, int(node_part)


def main(argv: list[str] | None = None) -> int:
    args, node_id = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s rackwise-agent %(levelname)s %(message)s",
    )
    count = 1 if args.once else (args.count or 0)
    max_attempts = args.max_attempts or (1 if args.once else 0)
    try:
        source = open_source(args)
    except Fatal as exc:
        print(f"rackwise-agent: error: {exc}", file=sys.stderr)
        return exc.code
    agent = Agent(
        client=Client(args.server, args.token, node_id, timeout=args.timeout),
        source=source,
        interval=args.interval,
        backoff_base=args.backoff_base,
        backoff_cap=args.backoff_cap,
        max_attempts=max_attempts,
        count=count,
        imex=source.read_imex if isinstance(source, SimulatedGpus) else read_imex_status,
    )
    # SIGTERM (systemd stop, kill) ends the loop between heartbeats.
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    try:
        return agent.run()
    except Fatal as exc:
        print(f"rackwise-agent: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        source.close()


if __name__ == "__main__":
    sys.exit(main())
