"""The node agent (python -m fleet.agent), run as a real process against a live
server, plus its pure parts (backoff, XID buffering, nvidia-smi parsing)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import agent as agent_module
from fleet import dispatch
from fleet.agent import Agent, Client, GpuReading, Retryable, backoff_delay, parse_nvidia_smi
from fleet.choices import GpuHealth, NodeState
from fleet.models import GPU, Node
from fleet.services.intake import health

ROOT = Path(__file__).resolve().parent.parent
# Every agent run is bounded: a hung agent fails the test instead of the suite.
TIMEOUT_S = 30


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [sys.executable, "-m", "fleet.agent", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def node(transactional_db, fleet, monkeypatch) -> Node:
    # The live server runs in this process: keep its on-commit task sends (node
    # failure -> recover_job) away from the real broker.
    monkeypatch.setattr(dispatch, "_send", lambda name, args: None)
    return Node.objects.get(hostname="r1-n00")


@pytest.fixture
def token(node) -> str:
    return health.issue_agent_token(None, node.pk)


def test_the_agent_delivers_a_simulated_heartbeat_to_a_live_server(live_server, node, token):
    result = run_agent("--server", live_server.url, "--token", token, "--simulate", "--once")

    assert result.returncode == 0, result.stderr
    assert "heartbeat accepted: r1-n00 is healthy" in result.stderr
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None
    assert node.state == NodeState.HEALTHY


@pytest.mark.parametrize("which", ["a wrong secret", "a rotated token"])
def test_a_refused_token_makes_the_agent_exit_non_zero_with_one_line(live_server, node, token, which):
    bad = f"{node.pk}.not-the-secret" if which == "a wrong secret" else token
    if which == "a rotated token":
        health.issue_agent_token(None, node.pk)

    # Not --once: a refused token must stop even an agent meant to run forever.
    result = run_agent("--server", live_server.url, "--token", bad, "--simulate", "--interval", "0.1")

    assert result.returncode == agent_module.EXIT_TOKEN_REFUSED
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "server refused the token (HTTP 401)" in lines[0]
    node.refresh_from_db()
    assert node.last_heartbeat_at is None


def test_a_simulated_xid_79_fails_the_node_through_the_agent(live_server, node, token):
    result = run_agent(
        "--server",
        live_server.url,
        "--token",
        token,
        "--simulate",
        "--fail-after",
        "1",
        "--count",
        "2",
        "--interval",
        "0.1",
    )

    assert result.returncode == 0, result.stderr
    assert "GPU 0: ok -> failed XID 79: GPU has fallen off the bus" in result.stderr
    assert "node r1-n00 is now failed" in result.stderr
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert "GPU 0: XID 79" in node.state_reason
    failed = GPU.objects.get(node=node, index=0)
    assert (failed.health, failed.last_xid) == (GpuHealth.FAILED, 79)
    assert set(GPU.objects.filter(node=node).exclude(index=0).values_list("health", flat=True)) == {"ok"}


def test_an_agent_for_a_node_with_fewer_gpus_is_refused_and_says_why(live_server, node, token):
    result = run_agent("--server", live_server.url, "--token", token, "--simulate", "--gpus", "8", "--once")

    assert result.returncode == agent_module.EXIT_REFUSED
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "HTTP 400" in lines[0] and "unknown GPU index 4" in lines[0]


def test_the_agent_retries_with_backoff_while_the_server_is_down():
    url = f"http://127.0.0.1:{closed_port()}"

    result = run_agent(
        "--server",
        url,
        "--token",
        "1.secret",
        "--simulate",
        "--max-attempts",
        "5",
        "--backoff-base",
        "0.05",
        "--backoff-cap",
        "0.2",
    )

    assert result.returncode == agent_module.EXIT_GAVE_UP
    lines = result.stderr.strip().splitlines()
    retries = [line for line in lines if "heartbeat failed (attempt" in line]
    assert len(retries) == 4, result.stderr
    delays = [float(line.rsplit("retrying in ", 1)[1].rstrip("s")) for line in retries]
    assert all(0 < d <= 0.2 for d in delays), delays
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith("rackwise-agent: error: gave up after 5 failed attempt(s)")


@pytest.mark.parametrize(
    "args",
    [
        ["--server", "ftp://example.com", "--token", "1.s", "--simulate"],
        ["--server", "http://127.0.0.1:1", "--token", "no-node-id", "--simulate"],
        ["--server", "http://127.0.0.1:1", "--token", "1.s", "--simulate", "--interval", "-3"],
        ["--server", "http://127.0.0.1:1", "--token", "1.s", "--fail-after", "2"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args):
    result = run_agent(*args)

    assert result.returncode == agent_module.EXIT_USAGE
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_agent_module_does_not_import_django():
    code = "import sys, fleet.agent; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )

    assert result.stdout.strip() == "[]", result.stderr


# --- the pure parts -------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_with_jitter():
    rng = random.Random(1)
    delays = [backoff_delay(n, base=1.0, cap=8.0, rng=rng) for n in range(1, 8)]

    for n, delay in enumerate(delays, start=1):
        ceiling = min(8.0, 2 ** (n - 1))
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)  # jittered, not a fixed schedule


class FlakyClient(Client):
    """Fails the first ``failures`` sends, then accepts; remembers payloads."""

    def __init__(self, failures: int) -> None:
        super().__init__("http://rackwise.invalid", "1.s", 1)
        self.failures, self.payloads = failures, []

    def send(self, payload):
        self.payloads.append(payload)
        if len(self.payloads) <= self.failures:
            raise Retryable("connection refused")
        return {"hostname": "h", "node_state": "failed", "node_state_before": "healthy", "gpus_changed": []}


class OneXidSource:
    name = "test"

    def __init__(self) -> None:
        self.reads = 0

    def read(self):
        self.reads += 1
        return [GpuReading(index=0, state="degraded", xids=[79] if self.reads == 1 else [])]

    def close(self):
        pass


def test_an_xid_seen_while_the_server_is_down_is_delivered_once_it_is_back():
    client = FlakyClient(failures=2)
    agent = Agent(client=client, source=OneXidSource(), interval=1.0, backoff_base=0.01, backoff_cap=0.01)

    for _ in range(4):
        agent.beat()

    sent_xids = [p["gpus"][0]["xids"] for p in client.payloads]
    assert sent_xids == [[79], [79], [79], []]
    assert agent.failures == 0 and agent.delivered == 2


def test_nvidia_smi_output_is_parsed_and_a_gpu_needing_reset_is_failed():
    text = "0, 41, 00000000:18:00.0\n1, [N/A], 00000000:2A:00.0\n2, [GPU requires reset], 00000000:3A:00.0\n"

    readings = parse_nvidia_smi(text)

    assert [(r.index, r.state, r.temperature_c) for r in readings] == [
        (0, "ok", 41.0),
        (1, "ok", None),
        (2, "failed", None),
    ]
    assert "requires reset" in readings[2].error


class FakeNvml:
    """Just enough of pynvml for NvmlGpus: two GPUs, queued XID events, and a GPU
    that can be lost."""

    NVML_TEMPERATURE_GPU = 0
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):  # pynvml's names
        pass

    class NVMLError_GpuIsLost(NVMLError):  # pynvml's names
        pass

    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []  # (GPU index, XID)
        self.lost: set[int] = set()
        self.registered: list[int] = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetIndex(self, handle):
        return int(handle.removeprefix("handle"))

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, kinds, event_set):
        assert kinds == self.nvmlEventTypeXidCriticalError
        self.registered.append(self.nvmlDeviceGetIndex(handle))

    def nvmlEventSetWait(self, event_set, timeout_ms):
        assert timeout_ms == 0  # never block the heartbeat loop
        if not self.events:
            raise self.NVMLError_Timeout()
        index, xid = self.events.pop(0)
        return type("Event", (), {"device": f"handle{index}", "eventData": xid})()

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if self.nvmlDeviceGetIndex(handle) in self.lost:
            raise self.NVMLError_GpuIsLost()
        return 47

    def nvmlEventSetFree(self, event_set):
        pass

    def nvmlShutdown(self):
        pass


def test_nvml_xid_events_are_drained_each_read_and_a_lost_gpu_is_failed(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = agent_module.NvmlGpus()
    fake.events = [(1, 79), (1, 13)]

    first = gpus.read()
    fake.lost.add(0)
    second = gpus.read()

    assert fake.registered == [0, 1]
    assert [(r.index, r.state, r.xids, r.temperature_c) for r in first] == [
        (0, "ok", [], 47.0),
        (1, "degraded", [79, 13], 47.0),
    ]
    assert [(r.index, r.state, r.xids) for r in second] == [(0, "failed", []), (1, "ok", [])]
    assert "lost" in second[0].error
