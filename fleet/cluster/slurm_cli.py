"""Slurm's own command-line tools, run through ``subprocess``, and the pure
parsers of what they print.

Why the CLI and not slurmrestd (both were tried against Slurm 24.11, see the
README's "Slurm" section): the CLI needs nothing running besides slurmctld, no
token to mint and renew, and every operation Rackwise needs (``requeuehold``,
``update NodeList``, ``scancel --signal --batch``, ``show topology``) is there;
slurmrestd is one more daemon, needs a JWT (``scontrol token``, which expires),
has no ``requeuehold`` nor topology endpoint, and answers "node_count is not a
field" style surprises. Reads use ``--json`` (``data_parser/v0.0.42``) except
``scontrol show topology``, which prints text only.

Errors, as the adapter contract wants them:

* :class:`~fleet.cluster.base.ClusterUnavailable` when the tool cannot reach
  slurmctld (connection refused, "Unable to contact slurm controller", a socket
  timeout), when it does not answer within the timeout, or when the binary
  cannot be run at all: nothing was done, retrying later is safe;
* :class:`SlurmError` (a :class:`~fleet.cluster.base.StepFailed`) when Slurm
  answered and refused: retrying the same command will not help.

Nothing here imports Django: the adapter (:mod:`fleet.cluster.slurm`) passes
the settings in.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import hostlist

from fleet.cluster.base import (
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_PENDING,
    JOB_RUNNING,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    ClusterUnavailable,
    JobReport,
    NodeReport,
    StepFailed,
)

# What Slurm's clients print when slurmctld is not there (src/common/slurm_errno.c
# and the clients' own wording); any of these means "retry later", not "refused".
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|Socket timed out|"
    r"Zero Bytes were transmitted or received|Communication connection failure|"
    r"Connection timed out|Network is unreachable|No route to host|"
    r"Unable to establish connection|Slurm backup controller in standby mode|"
    r"Transport endpoint is not connected|Resource temporarily unavailable",
    re.IGNORECASE,
)
TOOLS = ("sbatch", "scontrol", "squeue", "scancel", "sinfo", "sacct")


class SlurmError(StepFailed):
    """Slurm answered and refused (rc != 0 for a reason other than reachability)."""

    def __init__(
        self, message: str, *, command: list[str] | None = None, returncode: int | None = None
    ) -> None:
        super().__init__(message)
        self.command = command or []
        self.returncode = returncode


class SlurmCli:
    """Runs Slurm's clients. ``bin_dir``: where they are (the cluster's wrapper
    directory), else ``PATH``. ``timeout_s`` bounds every command."""

    def __init__(
        self, bin_dir: str | None = None, *, timeout_s: float = 20.0, env: dict[str, str] | None = None
    ) -> None:
        self.bin_dir = bin_dir or None
        self.timeout_s = timeout_s
        self.env = env

    def _binary(self, tool: str) -> str:
        if self.bin_dir:
            path = os.path.join(self.bin_dir, tool)
            if os.access(path, os.X_OK):
                return path
            raise ClusterUnavailable(f"Slurm client {tool} not found in RACKWISE_SLURM_BIN={self.bin_dir}")
        found = shutil.which(tool)
        if not found:
            raise ClusterUnavailable(f"Slurm client {tool} not found on PATH (set RACKWISE_SLURM_BIN)")
        return found

    def run(self, tool: str, *args: str, timeout: float | None = None) -> str:
        """Run ``tool args...`` and return its stdout; raise as the module docstring says."""
        command = [self._binary(tool), *args]
        shown = " ".join([tool, *args])
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout_s,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterUnavailable(
                f"Slurm did not answer `{shown}` within {timeout or self.timeout_s:g} s "
                "(RACKWISE_SLURM_TIMEOUT_S)"
            ) from exc
        except OSError as exc:
            raise ClusterUnavailable(f"cannot run `{shown}`: {exc}") from exc
        if done.returncode == 0:
            return done.stdout
        message = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}")[:1000]
        if _UNREACHABLE.search(message):
            raise ClusterUnavailable(f"slurmctld unreachable: `{shown}`: {message}")
        raise SlurmError(f"`{shown}` failed: {message}", command=[tool, *args], returncode=done.returncode)

    def json(self, tool: str, *args: str) -> dict[str, Any]:
        out = self.run(tool, *args)
        try:
            doc = json.loads(out)
        except ValueError as exc:
            # A truncated answer is a transport problem, not a refusal.
            raise ClusterUnavailable(f"`{tool} {' '.join(args)}` printed no JSON: {out[:200]!r}") from exc
        if not isinstance(doc, dict):
            raise ClusterUnavailable(f"`{tool} {' '.join(args)}` printed {type(doc).__name__}, not an object")
        errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
        if errors:
            text = "; ".join(str(e.get("description") or e.get("error") or e) for e in errors)
            if _UNREACHABLE.search(text):
                raise ClusterUnavailable(f"slurmctld unreachable: {text}")
            raise SlurmError(f"`{tool} {' '.join(args)}`: {text}", command=[tool, *args])
        return doc

    def ping(self) -> None:
        """``scontrol ping``: raise ClusterUnavailable at once if slurmctld is
        down. Measured here: ping answers "is DOWN" in under 10 ms, where any
        other client spends about 9 s retrying its connection first, so the
        adapter pings before each step and each read."""
        try:
            self.run("scontrol", "ping", timeout=min(self.timeout_s, 5.0))
        except SlurmError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "scontrol ping failed"
            raise ClusterUnavailable(f"slurmctld unreachable: {first}") from exc

    # --- reads -------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """``scontrol show nodes --json``: every node."""
        return list(self.json("scontrol", "show", "nodes", "--json").get("nodes") or [])

    def node(self, name: str) -> dict[str, Any] | None:
        try:
            nodes = self.json("scontrol", "show", "node", name, "--json").get("nodes") or []
        except SlurmError as exc:
            if "not found" in str(exc).lower() or "invalid node name" in str(exc).lower():
                return None
            raise
        return next((n for n in nodes if n.get("name") == name), None)

    def jobs(self) -> list[dict[str, Any]]:
        """``squeue --json``: the jobs slurmctld still lists (pending, running,
        and ended ones not yet purged)."""
        return list(self.json("squeue", "--json", "--states=all").get("jobs") or [])

    def job(self, job_id: str) -> dict[str, Any] | None:
        """``scontrol show job J --json``; None if Slurm does not know the id (any more)."""
        try:
            jobs = self.json("scontrol", "show", "job", str(job_id), "--json").get("jobs") or []
        except SlurmError as exc:
            if "invalid job id" in str(exc).lower():
                return None
            raise
        return jobs[0] if jobs else None

    def topology(self) -> str:
        """``scontrol show topology`` (text: ``--json`` is ignored there)."""
        return self.run("scontrol", "show", "topology")


# --- pure parsing --------------------------------------------------------------------


def expand_hostlist(expression: str | list | None) -> list[str]:
    """``r01n[01-03],r02n10`` -> the host names (python-hostlist, the same syntax
    as ``scontrol show hostnames``). Accepts a list of hostlists too."""
    if not expression:
        return []
    if isinstance(expression, list):
        return [h for part in expression for h in expand_hostlist(part)]
    if expression in ("(null)", "None assigned"):
        return []
    return hostlist.expand_hostlist(expression)


def number(value: Any) -> int | None:
    """A v0.0.42 number: a plain int, or ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        n = value.get("number")
        return n if isinstance(n, int) and not isinstance(n, bool) else None
    return None


def timestamp(value: Any) -> dt.datetime | None:
    n = number(value)
    return dt.datetime.fromtimestamp(n, tz=dt.UTC) if n else None


def _states(raw: Any) -> list[str]:
    if isinstance(raw, str):
        return [s for s in re.split(r"[+ ,]", raw.upper()) if s]
    if isinstance(raw, list):
        return [str(s).upper() for s in raw]
    return []


# Node states (base state and flags) that mean the node is out of service.
NODE_FAILED_STATES = frozenset({"DOWN", "FAIL", "FAILING", "ERROR", "INVALID_REG"})
NODE_DRAIN_STATES = frozenset({"DRAIN", "DRAINING", "DRAINED"})


def node_flags(states: Any) -> set[str]:
    return set(_states(states))


def node_state(states: Any) -> str | None:
    """Rackwise's view of a node's Slurm state list (``['IDLE', 'DRAIN']``):
    DOWN/FAIL -> failed, DRAIN -> draining, else healthy.

    None ("says nothing, keep what you have") for UNKNOWN and for
    NOT_RESPONDING without DOWN: measured on 24.11, a node is
    IDLE+NOT_RESPONDING for about a second after every ``State=RESUME``, and
    every node is UNKNOWN or not responding just after slurmctld restarts.
    A node that really stops answering is set DOWN by Slurm itself after
    ``SlurmdTimeout``, and DOWN is failed."""
    names = node_flags(states)
    if names & NODE_FAILED_STATES:
        return NODE_FAILED
    if names & NODE_DRAIN_STATES:
        return NODE_DRAINING
    if "NOT_RESPONDING" in names or names <= {"UNKNOWN"}:
        return None
    return NODE_HEALTHY


def node_report(item: dict[str, Any], jobs_on: dict[str, list[str]] | None = None) -> NodeReport | None:
    name = item.get("name")
    state = node_state(item.get("state"))
    if not isinstance(name, str) or not name or state is None:
        return None
    reason = item.get("reason") or ""
    return NodeReport(
        hostname=name,
        state=state,
        reason=str(reason)[:500] if state != NODE_HEALTHY else "",
        jobs=tuple((jobs_on or {}).get(name, ())),
    )


# Job base states (squeue/scontrol ``job_state``), by Rackwise job state.
_JOB_STATES = {
    "PENDING": JOB_PENDING,
    "REQUEUED": JOB_PENDING,
    "REQUEUE_HOLD": JOB_PENDING,
    "REQUEUE_FED": JOB_PENDING,
    "RUNNING": JOB_RUNNING,
    "CONFIGURING": JOB_RUNNING,
    "SUSPENDED": JOB_RUNNING,
    "RESIZING": JOB_RUNNING,
    "SIGNALING": JOB_RUNNING,
    "STAGE_OUT": JOB_RUNNING,
    "COMPLETED": JOB_COMPLETED,
    "CANCELLED": JOB_CANCELLED,
    "FAILED": JOB_FAILED,
    "TIMEOUT": JOB_FAILED,
    "NODE_FAIL": JOB_FAILED,
    "OUT_OF_MEMORY": JOB_FAILED,
    "BOOT_FAIL": JOB_FAILED,
    "DEADLINE": JOB_FAILED,
    "PREEMPTED": JOB_FAILED,
}
# Base states first: a job's list is its base state plus flags (COMPLETING,
# REQUEUED...), and a flag must not hide how the job ended.
_BASE_ORDER = (
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "RUNNING", "SUSPENDED", "PENDING", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT",
    "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
)  # fmt: skip


def job_base_state(states: Any) -> str:
    """The Slurm base state of a job's ``job_state`` list (``['PENDING', 'REQUEUED']`` -> PENDING)."""
    names = _states(states)
    if {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"} & set(names) and "RUNNING" not in names:
        # JOB_REQUEUE: a run that ended (NODE_FAIL under a DOWN node, say) on
        # its way back to the queue; the job has not ended.
        return "PENDING"
    for name in _BASE_ORDER:
        if name in names:
            return name
    return names[0] if names else "UNKNOWN"


def job_state(states: Any) -> str:
    """Rackwise's JOB_* for a Slurm ``job_state`` list; unknown states read as pending."""
    return _JOB_STATES.get(job_base_state(states), JOB_PENDING)


_GRES_GPU = re.compile(r"gres[/:]gpu(?::[^:,=]+)?[:=](\d+)")


def gpus_per_node(job: dict[str, Any]) -> int | None:
    """GPUs per node a Slurm job asks for: ``tres_per_node`` (``gres/gpu:4``,
    from ``--gres``/``--gpus-per-node``), else ``tres_req_str``'s total over its nodes."""
    per_node = job.get("tres_per_node") or ""
    if isinstance(per_node, str) and (m := _GRES_GPU.search(per_node)):
        return int(m.group(1))
    nodes = number(job.get("node_count")) or 1
    for key in ("tres_per_job", "tres_req_str"):
        text = job.get(key) or ""
        if isinstance(text, str) and (m := _GRES_GPU.search(text)):
            return max(1, int(m.group(1)) // nodes)
    return None


def is_held(job: dict[str, Any]) -> bool:
    """A pending job that waits for a release (``--hold``, ``scontrol hold``, requeuehold)."""
    if job.get("hold") is True:
        return True
    reason = str(job.get("state_reason") or "")
    return reason.startswith("JobHeld") or (
        job_base_state(job.get("job_state")) == "PENDING" and number(job.get("priority")) == 0
    )


@dataclass(frozen=True)
class SlurmJob:
    """The few fields of a Slurm job the adapter acts on."""

    job_id: str
    state: str  # Slurm base state (RUNNING, PENDING, ...)
    held: bool
    nodes: tuple[str, ...]  # where it runs (or ran)
    required: tuple[str, ...]  # --nodelist / update NodeList
    reason: str
    comment: str
    completing: bool = False  # still cleaning up on its nodes (a requeue in progress)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return job_state([self.state]) in (JOB_COMPLETED, JOB_FAILED, JOB_CANCELLED)

    @staticmethod
    def parse(item: dict[str, Any]) -> SlurmJob:
        return SlurmJob(
            job_id=str(item.get("job_id")),
            state=job_base_state(item.get("job_state")),
            held=is_held(item),
            nodes=tuple(expand_hostlist(item.get("nodes") or "")),
            required=tuple(expand_hostlist(item.get("required_nodes") or "")),
            reason=str(item.get("state_reason") or ""),
            comment=str(item.get("comment") or ""),
            completing="COMPLETING" in _states(item.get("job_state")),
            raw=item,
        )


def job_report(item: dict[str, Any]) -> JobReport:
    """A ``squeue``/``scontrol show job`` entry as a JobReport."""
    job = SlurmJob.parse(item)
    state = job_state(item.get("job_state"))
    reason = job.reason if job.reason and job.reason != "None" else ""
    if state in (JOB_FAILED, JOB_CANCELLED, JOB_COMPLETED):
        exit_code = item.get("exit_code")
        code = number(exit_code.get("return_code")) if isinstance(exit_code, dict) else None
        reason = (
            f"Slurm {job.state}"
            + (f", exit code {code}" if code else "")
            + (f" ({reason})" if reason else "")
        )
    return JobReport(
        external_id=job.job_id,
        state=state,
        hostnames=job.nodes if state != JOB_PENDING else (),
        started_at=timestamp(item.get("start_time")) if state != JOB_PENDING else None,
        ended_at=timestamp(item.get("end_time"))
        if state in (JOB_COMPLETED, JOB_FAILED, JOB_CANCELLED)
        else None,
        reason=reason[:500],
        name=str(item.get("name") or ""),
        user=str(item.get("user_name") or ""),
        num_nodes=number(item.get("node_count")),
        gpus_per_node=gpus_per_node(item),
        extra={
            "slurm_state": job.state,
            "held": job.held,
            "partition": item.get("partition") or "",
            "account": str(item.get("account") or ""),
            "comment": job.comment,
            "required_nodes": list(job.required),
        },
    )


@dataclass(frozen=True)
class TopologyBlock:
    name: str
    nodes: tuple[str, ...]
    size: int | None = None


def parse_show_topology(text: str) -> list[TopologyBlock]:
    """``scontrol show topology`` for topology/block: one line per block,
    ``BlockName=rack01 BlockIndex=0 Nodes=r01n[01-18] BlockSize=18``.
    Lines of other plugins (``SwitchName=``) and blank lines are skipped;
    aggregated blocks (whose name holds a hostlist such as ``b[1-2]``) too, since
    a rack is a base block."""
    blocks: list[TopologyBlock] = []
    for line in text.splitlines():
        fields = dict(tok.partition("=")[::2] for tok in line.split() if "=" in tok)
        name = fields.get("BlockName")
        if not name or "[" in name:
            continue
        size = fields.get("BlockSize")
        blocks.append(
            TopologyBlock(
                name=name,
                nodes=tuple(expand_hostlist(fields.get("Nodes") or "")),
                size=int(size) if size and size.isdigit() else None,
            )
        )
    return blocks
