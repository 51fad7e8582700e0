"""Several hosts on one machine, for tests of what crosses a network: each host
is a network namespace with one veth link to a switch (a Linux bridge in a
namespace of its own), and the test process's namespace is a host on the same
LAN. Traffic between hosts is real TCP over those links; cutting a host's link
at the switch drops everything to and from it (no reset: its peers see silence,
as when a cable or a top-of-rack switch fails), and healing it brings it back.

Needs root (``ip netns``). Names carry the test process's pid, so two runs on
one machine do not meet; :meth:`Lan.close` removes every namespace and link.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def netns_available() -> str | None:
    """Why this machine cannot make network namespaces, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"rwprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"`ip netns add` failed: {getattr(exc, 'stderr', exc)}"
    _ip("netns", "del", name)
    return None


@dataclass
class Host:
    """One host: a namespace, its address on the LAN, the processes it runs."""

    name: str
    ns: str
    ip: str
    port: str  # the switch's end of its link
    procs: list[subprocess.Popen] = field(default_factory=list)

    def spawn(
        self, args: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None
    ) -> subprocess.Popen:
        """Run ``args`` on this host, output to ``log``; killed with the host."""
        out = log.open("ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, args: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns, *args], env=env, capture_output=True, text=True
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()


class Lan:
    """A switch and the hosts linked to it, on 10.213.<n>.0/24 (``n`` from the
    pid). The test process is ``self.me`` (.254)."""

    def __init__(self) -> None:
        self.tag = f"rw{os.getpid() % 100000}"
        self.net = f"10.213.{100 + os.getpid() % 150}"
        self.switch = f"{self.tag}sw"
        self.hosts: dict[str, Host] = {}
        self._root_link: str | None = None
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        try:
            self.me = self._link(None, "me", 254)
        except BaseException:
            self.close()
            raise

    def _link(self, ns: str | None, name: str, octet: int) -> Host:
        mine, theirs = f"{self.tag}{name}"[:15], f"{self.tag}{name}s"[:15]
        _ip("link", "add", mine, "type", "veth", "peer", "name", theirs, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", theirs, "master", "br0", "up")
        where: list[str] = []
        if ns is None:
            self._root_link = mine
        else:
            _ip("link", "set", mine, "netns", ns)
            where = ["-n", ns]
            _ip(*where, "link", "set", "lo", "up")
        ip = f"{self.net}.{octet}"
        _ip(*where, "addr", "add", f"{ip}/24", "dev", mine)
        _ip(*where, "link", "set", mine, "up")
        return Host(name, ns or "", ip, theirs)

    def add(self, name: str) -> Host:
        ns = f"{self.tag}{name}"
        _ip("netns", "add", ns)
        host = self._link(ns, name, len(self.hosts) + 1)
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Unplug ``host`` at the switch: every packet to and from it is lost."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def close(self) -> None:
        for host in reversed(self.hosts.values()):  # the services' hosts last
            host.stop()
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
        if self._root_link:
            subprocess.run(["ip", "link", "del", self._root_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)


def wait_for_port(ip: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((ip, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing answers on {ip}:{port} after {timeout:.0f} s")
