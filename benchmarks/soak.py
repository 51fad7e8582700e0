#!/usr/bin/env python3
"""The whole stack, run as its users run it, for a while, then checked.

    benchmarks/soak.py --minutes 30          # prints the figures; exit 1 if a check fails

1. A fresh copy of this checkout (the files a clone has: no ``.venv``, no
   ``var/``), and in it the README's first command, ``./scripts/run --port P``,
   with nothing set: its own virtualenv, private PostgreSQL and Redis, the demo
   workload (node failures and repairs included).
2. An operator client on the API, with a token made the README's way
   (``scripts/manage create_api_user``): it approves every proposal (asking
   again with ``confirm`` when an approval answers 409 with a new cost), asks
   for a defrag plan now and then, and marks a busy node failed now and then.
3. A sampler: every ``--sample-s`` the fleet's checks (``scripts/manage
   check_fleet --json``) and the fragmentation figure from the API and /metrics.
4. At the end, the figures (see :class:`Figures`) and the checks: invariants
   clean, no GPU ever held twice, no job the fleet had room for left waiting,
   every approved action ended well or restored what it stopped, every expired
   proposal says why, no 5xx and no traceback in any log, one fragmentation figure.

``tests/test_soak.py`` runs the same for a few minutes in the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.stack import free_port  # noqa: E402

# A job the fleet had room for may wait this long (a scheduling pass runs on
# every change and at least every 30 s) before the soak calls it stuck.
STUCK_AFTER_S = 75.0


def fresh_checkout(dest: Path, ref: str | None = None) -> Path:
    """The files a clone of this checkout would have: those of commit ``ref``,
    else the working tree's (tracked, plus untracked ones git does not ignore,
    so a change not yet committed is tried too)."""
    if ref:
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if name.startswith("var/") or not src.exists():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def user_env(**extra: str) -> dict[str, str]:
    """A new user's shell: a PATH and a HOME, nothing of Rackwise's set."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CACHE_DIR")
    return {k: v for k, v in os.environ.items() if k in keep} | extra


class Api:
    """A token client that counts every answer's status."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base.rstrip("/"), token
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Token {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        self.statuses[status] += 1
        if status >= 500:
            self.errors.append(f"{method} {path}: {status} {raw[:300]!r}")
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path: str) -> object:
        return self.call("GET", path)[1]


def interruptible() -> None:
    """A child's SIGINT at its default and unblocked, whatever its parent did to it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Stack:
    """``./scripts/run --port P`` in ``checkout``, as a user starts it."""

    def __init__(self, checkout: Path, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.checkout, self.port = checkout, port or free_port()
        self.env = user_env(**(env or {}))
        self.log_path = checkout / "soak-run.log"
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 600.0) -> Stack:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            ["./scripts/run", "--port", str(self.port)],
            cwd=self.checkout,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Ctrl-C must reach it even when this process was started with SIGINT
            # ignored (a background job of a non-interactive shell, as CI may be):
            # bash cannot undo an ignore it inherits, and stop() would fall back.
            preexec_fn=interruptible,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"scripts/run exited {self.proc.returncode}:\n{self.run_log()[-3000:]}")
            if "Listening on TCP address" in self.run_log():
                return self
            time.sleep(0.5)
        raise RuntimeError(f"scripts/run did not serve within {timeout:.0f} s:\n{self.run_log()[-3000:]}")

    def run_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def manage(self, *args: str, timeout: float = 120.0) -> str:
        """``scripts/manage ARGS`` in the checkout: the running stack's database."""
        result = subprocess.run(
            ["scripts/manage", *args],
            cwd=self.checkout,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode:
            raise RuntimeError(
                f"scripts/manage {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}"
            )
        return result.stdout

    def token(self, username: str, role: str) -> str:
        return self.manage("create_api_user", username, "--role", role).strip()

    def stop(self) -> int | None:
        """Ctrl-C, as a user stops it: scripts/run stops everything it started."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            # supervisord's programs and the private PostgreSQL and Redis run in
            # process groups of their own: every process started from the checkout.
            subprocess.run(["pkill", "-KILL", "-f", str(self.checkout)], check=False)
            return self.proc.wait(timeout=30)

    def logs(self) -> dict[str, str]:
        """scripts/run's own output and every worker's log under var/."""
        out = {"run": self.run_log()}
        for path in sorted((self.checkout / "var").glob("*.log")):
            out[path.name] = path.read_text(errors="replace")
        return out


@dataclass
class Figures:
    minutes: float = 0.0
    jobs_submitted: int = 0
    jobs_started: int = 0
    nodes_failed_by_soak: int = 0
    gangs_submitted: int = 0
    defrag_requests: int = 0
    approvals: int = 0
    approvals_reconfirmed: int = 0
    approved_actions: dict[str, int] = field(default_factory=dict)  # final state -> count
    gpu_hours_lost_to_failed_plans: float = 0.0
    # Approved actions that failed after a step stopped a job (a reported figure,
    # not a check: preemptions hold no nodes yet, see the README).
    failed_after_stopping_a_job: list[str] = field(default_factory=list)
    expired_without_reason: list[int] = field(default_factory=list)
    samples: int = 0
    violations: list[str] = field(default_factory=list)
    gpus_ever_held_twice: int = 0
    stuck_jobs: list[str] = field(default_factory=list)  # room for it, yet waiting past STUCK_AFTER_S
    missed_jobs: list[str] = field(default_factory=list)  # room by counts, the engine found none
    api_5xx: list[str] = field(default_factory=list)
    web_5xx: int = 0
    tracebacks: list[str] = field(default_factory=list)
    fragmentation_disagreements: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        """The checks the soak must pass, as sentences; empty when all pass."""
        # An approved action may fail or expire, if it cost nothing (lost GPU-hours
        # are checked below); it may not be left unfinished.
        unfinished = {k: v for k, v in self.approved_actions.items() if k in ("approved", "executing")}
        checks = [
            (not self.violations, f"invariants broken: {self.violations[:5]}"),
            (self.gpus_ever_held_twice == 0, f"{self.gpus_ever_held_twice} GPU(s) held twice at once"),
            (not self.stuck_jobs, f"jobs the fleet had room for left waiting: {self.stuck_jobs[:5]}"),
            (
                not self.missed_jobs,
                f"jobs racks had idle room for that the engine could not place: {self.missed_jobs[:5]}",
            ),
            (
                self.gpu_hours_lost_to_failed_plans == 0,
                f"{self.gpu_hours_lost_to_failed_plans:.1f} GPU-hours lost to failed plans",
            ),
            (
                not self.expired_without_reason,
                f"expired without a reason: actions {self.expired_without_reason[:10]}",
            ),
            (
                not self.api_5xx and not self.web_5xx,
                f"5xx answers: {self.web_5xx} in the web log; {self.api_5xx[:3]}",
            ),
            (not self.tracebacks, f"tracebacks in {self.tracebacks}"),
            (
                not self.fragmentation_disagreements,
                f"fragmentation figures disagree: {self.fragmentation_disagreements[:3]}",
            ),
            (self.jobs_started > 0, "no job started"),
            (self.samples > 0, "no sample taken"),
            (not unfinished, f"approved actions left unfinished: {unfinished}"),
        ]
        return [message for ok, message in checks if not ok]


class Soak:
    """The operator client and the sampler, on a running :class:`Stack`."""

    def __init__(
        self,
        stack: Stack,
        *,
        seed: int = 0,
        sample_s: float = 20.0,
        defrag_every_s: float = 60.0,
        fail_every_s: float = 45.0,
        gang_every_s: float = 50.0,
    ) -> None:
        self.stack, self.rng = stack, random.Random(seed)
        self.sample_s, self.defrag_every_s, self.fail_every_s = sample_s, defrag_every_s, fail_every_s
        self.gang_every_s = gang_every_s
        self.api = Api(stack.url, stack.token("soak-operator", "operator"))
        self.figures = Figures()
        self.approved: set[int] = set()
        self.first_room: dict[int, float] = {}  # job -> when a sample first saw room for it
        self._stop = threading.Event()

    # --- the operator -------------------------------------------------------------

    def approve_proposals(self) -> None:
        status, page = self.api.call("GET", "/api/actions/?state=proposed&limit=100")
        for action in (page or {}).get("results", []) if isinstance(page, dict) else []:
            action_id = action["id"]
            status, body = self.api.call("POST", f"/api/actions/{action_id}/approve/", {"note": "soak"})
            if status == 409 and isinstance(body, dict) and body.get("replanned"):
                # The plan went stale and was re-planned as a new one: the operator
                # reads its cost and approves it, which confirms it.
                self.figures.approvals_reconfirmed += 1
                action_id = body["action"]["id"]
                status, body = self.api.call(
                    "POST",
                    f"/api/actions/{action_id}/approve/",
                    {"note": f"soak: new cost {body['cost_gpu_hours']} GPU-h accepted"},
                )
            if status == 200:
                self.figures.approvals += 1
                self.approved.add(action_id)

    def request_defrag(self) -> None:
        """Ask for one more wholly free rack than there is now (a goal that needs
        moves, whenever the fleet is busy enough to need any)."""
        summary = self.api.get("/api/fleet/summary/")
        per_rack = summary.get("free_nodes_per_rack", []) if isinstance(summary, dict) else []
        racks = self.api.get("/api/racks/?limit=1000")
        size = (
            {r["id"]: r["nodes_per_domain"] for r in racks.get("results", [])}
            if isinstance(racks, dict)
            else {}
        )
        free = sum(1 for r in per_rack if size.get(r["rack_id"]) and r["nodes_free"] >= size[r["rack_id"]])
        self.figures.defrag_requests += 1
        self.api.call("POST", "/api/actions/defrag/", {"free_racks": max(1, min(free + 1, len(per_rack)))})

    def submit_gang(self) -> None:
        """An ML engineer's job the demo mix lacks: a gang in segments, each
        segment inside one rack (as Slurm's --segment), of each locality."""
        self.figures.gangs_submitted += 1
        self.api.call(
            "POST",
            "/api/jobs/",
            {
                "name": f"segmented-{self.figures.gangs_submitted}",
                "tenant": "llm",
                "num_nodes": 12,
                "gpus_per_node": 4,
                "segment_nodes": self.rng.choice([4, 6]),
                "locality": self.rng.choice(["required", "preferred", "none"]),
                "expected_duration_s": self.rng.randint(90, 300),
                "preemptible": True,
            },
        )

    def fail_a_busy_node(self) -> None:
        """Mark a node that runs a job failed, as an operator would on an XID."""
        racks = self.api.get("/api/racks/?limit=1000")
        racks = racks.get("results", []) if isinstance(racks, dict) else []
        if not racks:
            return
        rack = self.api.get(f"/api/racks/{self.rng.choice(racks)['id']}/")
        busy = [
            n for n in rack.get("nodes", []) if n["state"] == "healthy" and any(g["job"] for g in n["gpus"])
        ]
        if busy:
            node = self.rng.choice(busy)
            status, _ = self.api.call(
                "POST", f"/api/nodes/{node['id']}/mark-failed/", {"reason": "XID 79 (soak)", "confirm": True}
            )
            self.figures.nodes_failed_by_soak += status == 200

    # --- the sampler --------------------------------------------------------------

    def sample(self) -> None:
        report = json.loads(self.stack.manage("check_fleet", "--json"))
        self.figures.samples += 1
        self.figures.violations += [v for v in report["violations"] if v not in self.figures.violations]
        now = time.monotonic()
        waiting = {w["job"]: w for w in report["waiting"]}
        for job, w in waiting.items():
            if (
                w["room_by_counts"]
                and not w["placed_alone"]
                and not any(m.startswith(f"#{job} ") for m in self.figures.missed_jobs)
            ):
                self.figures.missed_jobs.append(f"#{job} {w['name']}: {w['reason']}")
            if w["placed_by_pass"]:
                first = self.first_room.setdefault(job, now)
                if now - first > STUCK_AFTER_S and not any(
                    m.startswith(f"#{job} ") for m in self.figures.stuck_jobs
                ):
                    self.figures.stuck_jobs.append(
                        f"#{job} {w['name']} for {now - first:.0f} s: {w['reason']}"
                    )
            else:
                self.first_room.pop(job, None)
        for job in set(self.first_room) - set(waiting):
            del self.first_room[job]
        self.check_fragmentation()

    def check_fragmentation(self) -> None:
        """One figure: the API's and /metrics' agree (both read the same model)."""
        api = self.api.get("/api/fleet/fragmentation/")
        metrics = urllib.request.urlopen(self.stack.url + "/metrics", timeout=30).read().decode()
        found = re.search(r"^rackwise_fragmentation (\S+)$", metrics, re.M)
        if not isinstance(api, dict) or not found:
            self.figures.fragmentation_disagreements.append("no figure in the API or /metrics")
            return
        if abs(float(api["fraction"]) - float(found.group(1))) > 1e-6:
            self.figures.fragmentation_disagreements.append(
                f"API {api['fraction']} /metrics {found.group(1)}"
            )

    # --- the run ------------------------------------------------------------------

    def run(self, minutes: float) -> Figures:
        start = time.monotonic()
        end = start + minutes * 60
        next_sample = start + self.sample_s
        next_defrag = start + self.defrag_every_s / 2
        next_failure = start + self.fail_every_s
        next_gang = start + 5
        while time.monotonic() < end:
            self.approve_proposals()
            now = time.monotonic()
            if now >= next_defrag:
                self.request_defrag()
                next_defrag = now + self.defrag_every_s
            if now >= next_failure:
                self.fail_a_busy_node()
                next_failure = now + self.fail_every_s
            if now >= next_gang:
                self.submit_gang()
                next_gang = now + self.gang_every_s
            if now >= next_sample:
                self.sample()
                next_sample = now + self.sample_s
            time.sleep(1.0)
        self.figures.minutes = round((time.monotonic() - start) / 60, 2)
        self.settle()
        return self.figures

    def settle(self, timeout: float = 120.0) -> None:
        """Let the approved actions end (no new approvals), then take the last figures."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            page = self.api.get("/api/actions/?state=executing&limit=1")
            page2 = self.api.get("/api/actions/?state=approved&limit=1")
            if not (page.get("count") or page2.get("count")):
                break
            time.sleep(2)
        self.sample()
        f = self.figures
        states: Counter[str] = Counter()
        for action_id in sorted(self.approved):
            action = self.api.get(f"/api/actions/{action_id}/")
            states[action["state"]] += 1
            if action["state"] != "succeeded":  # a plan that finished lost nothing to failure
                f.gpu_hours_lost_to_failed_plans += float(action.get("lost_gpu_hours") or 0.0)
            done = (action.get("steps") or [])[: action.get("step_index") or 0]
            if action["state"] == "failed" and any(
                isinstance(s, dict) and s.get("op") in ("stop", "preempt", "requeue") for s in done
            ):
                f.failed_after_stopping_a_job.append(
                    f"#{action_id} {action['kind']}: {action.get('error', '')[:120]}"
                )
        f.approved_actions = dict(states)
        expired = self.api.get("/api/actions/?state=expired&limit=1000")
        f.expired_without_reason = [
            a["id"] for a in expired.get("results", []) if not (a.get("error") or "").strip()
        ]
        jobs = self.api.get("/api/jobs/?limit=1")
        f.jobs_submitted = jobs.get("count", 0)
        started = 0
        for state in ("running", "completed", "recovering"):
            started += self.api.get(f"/api/jobs/?state={state}&limit=1").get("count", 0)
        f.jobs_started = started
        f.gpus_ever_held_twice = json.loads(self.stack.manage("check_fleet", "--json"))[
            "gpus_ever_held_twice"
        ]
        f.api_5xx = list(self.api.errors)

    def read_logs(self) -> None:
        """5xx in the web log and tracebacks anywhere (the logs so far)."""
        for name, text in self.stack.logs().items():
            if "Traceback (most recent call last)" in text:
                self.figures.tracebacks.append(name)
            if name == "run":
                self.figures.web_5xx += len(re.findall(r'" 5\d\d \d', text))


def soak(
    minutes: float,
    *,
    keep: Path | None = None,
    port: int | None = None,
    seed: int = 0,
    ref: str | None = None,
) -> Figures:
    with tempfile.TemporaryDirectory(prefix="rackwise-soak-") as tmp:
        checkout = fresh_checkout(keep or Path(tmp) / "rackwise", ref)
        stack = Stack(checkout, port).start()
        try:
            run = Soak(stack, seed=seed)
            figures = run.run(minutes)
        finally:
            stack.stop()
        run.read_logs()
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int)
    parser.add_argument("--keep", type=Path, help="make the fresh checkout here and keep it (logs in var/)")
    parser.add_argument("--ref", help="a commit to soak (default: the working tree as it is)")
    args = parser.parse_args()
    figures = soak(args.minutes, keep=args.keep, port=args.port, seed=args.seed, ref=args.ref)
    print(json.dumps(figures.__dict__, indent=2))
    failures = figures.failures()
    for line in failures:
        print(f"FAILED: {line}")
    print("soak: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
