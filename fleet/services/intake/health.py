"""Node health from agents: agent tokens, heartbeats and silence detection.

Each node runs ``python -m fleet.agent``, which posts a heartbeat every few
seconds with the health of each GPU. This module turns those into state:

- a GPU reporting a fatal XID (``settings.RACKWISE_FATAL_XIDS``) or state
  ``failed`` fails its node through :func:`fleet.services.nodes.moves.mark_node_failed`,
  so the jobs on it are interrupted and recovered like any other failure;
- a node that goes silent becomes ``suspect`` after
  ``RACKWISE_HEARTBEAT_SUSPECT_S`` and ``failed`` after
  ``RACKWISE_HEARTBEAT_FAILED_S`` (:func:`detect_failures`, run periodically);
- a suspect node that speaks again with all GPUs fine is healthy again.

Lock order, as everywhere in the services: node rows first, then jobs, and rack
rows (the version bump) last.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet import dispatch
from fleet import gpu_signals as signals
from fleet import gpu_verdicts as verdicts
from fleet.choices import OPEN_ACTION_STATES, ActionKind, GpuHealth, NodeState, Verdict
from fleet.models import GPU, Action, AgentToken, GpuReading, Node, NodeReading, Rack
from fleet.services import audit, webhooks
from fleet.services import health_rules as rule_services
from fleet.services.actions.propose import propose
from fleet.services.errors import ClusterDown, InvalidInput
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.services.nodes.moves import drain_node, mark_node_failed, return_node_to_service
from fleet.services.racks import bump_versions, set_fabric_state
from fleet.steps import Drain

# What the common XIDs mean (NVIDIA's XID catalog), for GPU ``last_error`` and
# failure reasons an operator can act on without looking the number up.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

log = logging.getLogger(__name__)

GPU_STATES = (GpuHealth.OK, GpuHealth.DEGRADED, GpuHealth.FAILED)
# Bounds of a heartbeat's fields, from the columns they end up in: GPU.last_xid
# is a 32-bit integer column, GPU.last_error holds 500 characters. A value the
# database would refuse must be a 400 here, never a 500 (the agent retries the
# same payload, so a 500 repeats until the node is failed for silence).
MAX_XID = 2**31 - 1
MAX_XIDS_PER_GPU = 256  # XIDs since the last delivered heartbeat; far above any burst
MAX_ERROR_CHARS = 500
MAX_VERSION_CHARS = 100
TEMPERATURE_RANGE_C = (-100.0, 300.0)
_SEVERITY: dict[str, int] = {GpuHealth.OK: 0, GpuHealth.DEGRADED: 1, GpuHealth.FAILED: 2}
TOKEN_PREFIX_SEPARATOR = "."


def describe_xid(xid: int) -> str:
    """``"XID 79: GPU has fallen off the bus"``, or ``"XID 999"`` for an unknown code."""
    meaning = XID_MEANINGS.get(xid)
    return f"XID {xid}: {meaning}" if meaning else f"XID {xid}"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class AgentPrincipal:
    """Who is calling when a node's agent authenticates: not a user, and scoped to
    one node. Quacks enough like a user for DRF (``is_authenticated``) and for the
    audit log (``pk`` None, ``get_username``), so audit records name the agent."""

    node_id: int
    hostname: str
    pk: None = None
    is_authenticated: bool = True
    is_anonymous: bool = False
    is_superuser: bool = False
    is_staff: bool = False

    def get_username(self) -> str:
        return f"agent:{self.hostname}"

    def __str__(self) -> str:
        return self.get_username()


# --- tokens ---------------------------------------------------------------------------


def issue_agent_token(actor, node_id: int) -> str:
    """Create or rotate the agent token of a node and return it, once, as
    ``<node_id>.<secret>``. Only a SHA-256 hash of the secret is stored, so a
    leaked database does not let anyone post heartbeats; rotating invalidates the
    previous token at once."""
    secret = secrets.token_urlsafe(32)  # URL-safe alphabet: never contains "."
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        token, created = AgentToken.objects.update_or_create(
            node=node, defaults={"key": _hash(secret), "created_at": timezone.now()}
        )
        audit.record(
            actor,
            "node.agent_token",
            node,
            after={"token_created_at": token.created_at.isoformat()},
            message="agent token issued" if created else "agent token rotated; the old one no longer works",
        )
        # No rack version bump: a token is not part of what rack views show.
    return f"{node.pk}{TOKEN_PREFIX_SEPARATOR}{secret}"


def authenticate_agent(token: str) -> AgentPrincipal | None:
    """The principal for a ``<node_id>.<secret>`` token, or None if it is malformed,
    unknown or rotated."""
    node_part, sep, secret = token.partition(TOKEN_PREFIX_SEPARATOR)
    if not sep or not secret or not node_part.isdigit():
        return None
    row = AgentToken.objects.select_related("node").filter(node_id=int(node_part)).first()
    # Constant-time comparison, so response timing says nothing about the hash.
    if row is None or not hmac.compare_digest(row.key, _hash(secret)):
        return None
    return AgentPrincipal(node_id=row.node_id, hostname=row.node.hostname)


# --- heartbeats -----------------------------------------------------------------------


@dataclass
class GpuReport:
    index: int
    state: str
    xids: list[int] = field(default_factory=list)
    temperature_c: float | None = None
    error: str = ""
    # What NVML read (fleet.gpu_signals); None from an agent that sends none.
    signals: dict[str, Any] | None = None
    unsupported: list[str] = field(default_factory=list)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_error(value: Any, limit: int) -> str | None:
    """Why ``value`` cannot be stored as text of at most ``limit`` characters."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > limit:
        return f"must be at most {limit} characters (found {len(value)})"
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL.
        return "must not contain NUL characters"
    return None


def _gpu_entry_errors(entry: Any, gpu_indices: set[int], seen: set[int], known: str) -> dict[str, list[str]]:
    """Problems with one element of ``gpus``, keyed by the field's suffix."""
    if not isinstance(entry, dict):
        return {"": ["must be an object"]}
    errors: dict[str, list[str]] = {}
    index, state = entry.get("index"), entry.get("state")
    xids, temperature = entry.get("xids", []), entry.get("temperature_c")
    if not _is_int(index):
        errors[".index"] = ["required: an integer GPU index"]
    elif index not in gpu_indices:
        errors[".index"] = [f"unknown GPU index {index}; this node has GPUs {known}"]
    elif index in seen:
        errors[".index"] = [f"GPU {index} is reported twice"]
    if state not in GPU_STATES:
        errors[".state"] = [f"unknown state {state!r}; use ok, degraded or failed"]
    if not isinstance(xids, list) or not all(_is_int(x) and 0 <= x <= MAX_XID for x in xids):
        errors[".xids"] = [f"must be a list of integers from 0 to {MAX_XID}"]
    elif len(xids) > MAX_XIDS_PER_GPU:
        errors[".xids"] = [f"at most {MAX_XIDS_PER_GPU} XIDs per heartbeat (found {len(xids)})"]
    low, high = TEMPERATURE_RANGE_C
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or not low <= temperature <= high
    ):
        errors[".temperature_c"] = [f"must be null or a number from {low:g} to {high:g}"]
    problem = _text_error(entry.get("error", ""), MAX_ERROR_CHARS)
    if problem:
        errors[".error"] = [problem]
    if "signals" in entry or "unsupported" in entry:
        found = signals.signal_errors(entry.get("signals", {}), entry.get("unsupported", []))
        errors.update({f".{key}": messages for key, messages in found.items()})
    return errors


def validate_heartbeat(payload: Any, gpu_indices: set[int]) -> tuple[list[GpuReport], str]:
    """Check a heartbeat payload against the node's GPUs. Returns the GPU reports
    and the agent version; raises InvalidInput naming every bad field (the
    node-level ``imex`` included: :func:`record_heartbeat` reads it).

    Keys this server does not know are ignored rather than refused: a newer agent
    must not get every heartbeat rejected (and its node failed for silence)."""
    if not isinstance(payload, dict):
        raise InvalidInput({"non_field_errors": ["the heartbeat must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    version = payload.get("agent_version", "")
    problem = _text_error(version, MAX_VERSION_CHARS)
    if problem:
        errors["agent_version"] = [problem]
    if "imex" in payload:
        errors.update(signals.imex_errors(payload["imex"]))
    gpus = payload.get("gpus")
    if not isinstance(gpus, list):
        errors["gpus"] = ['required: a list of {"index", "state", "xids", "temperature_c"} objects']
        raise InvalidInput(errors)
    known = ", ".join(str(i) for i in sorted(gpu_indices)) or "none"
    if len(gpus) > len(gpu_indices):
        errors["gpus"] = [f"{len(gpus)} entries, but this node has {len(gpu_indices)} GPUs ({known})"]
        # The number of entries is the sender's to choose: look at no more than
        # one past the node's GPUs, enough to name the first one too many.
        gpus = gpus[: len(gpu_indices) + 1]
    reports: list[GpuReport] = []
    seen: set[int] = set()
    for n, entry in enumerate(gpus):
        entry_errors = _gpu_entry_errors(entry, gpu_indices, seen, known)
        errors.update({f"gpus[{n}]{key}": messages for key, messages in entry_errors.items()})
        if not entry_errors:
            seen.add(entry["index"])
            reports.append(
                GpuReport(
                    index=entry["index"],
                    state=entry["state"],
                    xids=list(entry.get("xids", [])),
                    temperature_c=entry.get("temperature_c"),
                    error=entry.get("error", "")[:200],
                    signals=entry.get("signals"),
                    unsupported=list(entry.get("unsupported", [])),
                )
            )
    if errors:
        raise InvalidInput(errors)
    return reports, version


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _assess(report: GpuReport) -> tuple[str, int | None, str]:
    """(health, xid, error text) for one GPU report. The agent's state is escalated
    by the XIDs it saw: any XID means degraded, a fatal one failed."""
    fatal = [x for x in report.xids if x in settings.RACKWISE_FATAL_XIDS]
    xid = fatal[0] if fatal else (report.xids[-1] if report.xids else None)
    health = report.state
    if report.xids and _SEVERITY[health] < _SEVERITY[GpuHealth.DEGRADED]:
        health = GpuHealth.DEGRADED
    if fatal:
        health = GpuHealth.FAILED
    if xid is not None:
        error = describe_xid(xid)
    elif health != GpuHealth.OK:
        error = report.error or f"agent reported the GPU {health}"
    else:
        error = ""
    return health, xid, error


def record_heartbeat(node_id: int, payload: Any) -> dict[str, Any]:
    """Record one heartbeat from a node's agent and act on it. Returns what changed::

        {"node_id", "hostname", "node_state", "node_state_before",
         "last_heartbeat_at", "agent_version",
         "gpus_changed": [{"index", "health_before", "health", "last_error"}]}

    Steps:
      1. stamp ``last_heartbeat_at`` (liveness), on its own and before looking at
         the report, as Kubernetes keeps a node's lease apart from its status: an
         authenticated agent that talks is alive, whatever its report says;
      2. validate the whole report; a refused one raises InvalidInput (a 400
         naming every bad field) and writes no GPU health, but a suspect node
         whose GPUs were all fine is still back from silence
         (:func:`_resume_after_refused_report`);
      3. lock the node, apply each GPU's health, auditing changes only
         (heartbeats are frequent);
      4. fail the node if a GPU failed, or return a suspect node whose GPUs are all
         fine to service; a failed or in-repair node is left for an operator;
      5. bump the rack version last.
    """
    now = timezone.now()
    # 1. One UPDATE in its own (autocommit) statement: it commits even when the
    # report below is refused or its transaction fails.
    Node.objects.filter(pk=node_id).update(last_heartbeat_at=now)
    gpu_indices = set(GPU.objects.filter(node_id=node_id).values_list("index", flat=True))
    try:
        reports, version = validate_heartbeat(payload, gpu_indices)
    except InvalidInput as exc:
        _resume_after_refused_report(node_id, exc)
        raise
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        agent = AgentPrincipal(node_id=node.pk, hostname=node.hostname)
        state_before = node.state

        # The node lock serialises every writer of this node's GPU health (other
        # heartbeats, return-to-service), so the GPU rows need no lock of their own;
        # a FOR UPDATE here would also block placements, whose allocation inserts
        # take a key-share lock on the GPU rows.
        gpus = {g.index: g for g in GPU.objects.filter(node=node)}
        judged = _store_readings(node, gpus, reports, payload.get("imex"), now)
        changed: list[dict[str, Any]] = []
        gpus_written = False
        failures: list[str] = []
        to_drain: list[str] = []
        for report in reports:
            gpu = gpus[report.index]
            health, xid, error = _assess(report)
            verdict, why = judged.get(report.index, ("", ""))
            if verdict == Verdict.FAIL:
                health, error = GpuHealth.FAILED, why
            elif verdict and health == GpuHealth.OK:
                health, error = GpuHealth.DEGRADED, why
            if verdict == Verdict.DRAIN:
                to_drain.append(f"GPU {gpu.index}: {why}")
            if gpu.health == GpuHealth.FAILED and health != GpuHealth.FAILED:
                # A failed GPU stays failed until an operator returns the node
                # to service (which resets GPU health): a reboot can hide a fault.
                health, error = GpuHealth.FAILED, gpu.last_error
            if health == GpuHealth.FAILED:
                failures.append(f"GPU {gpu.index}: {error}")
            before = {"health": gpu.health, "last_xid": gpu.last_xid, "last_error": gpu.last_error}
            last_xid = xid if xid is not None else gpu.last_xid
            after = {"health": health, "last_xid": last_xid, "last_error": error}
            if after == before:
                continue
            health_changed = health != gpu.health
            gpu.health, gpu.last_xid, gpu.last_error = health, last_xid, error
            if health_changed:
                gpu.health_changed_at = now
            gpu.save(update_fields=["health", "last_xid", "last_error", "health_changed_at"])
            gpus_written = True
            if health_changed:
                audit.record(agent, "gpu.health", gpu, before=before, after=after, message=error)
                changed.append(
                    {
                        "index": gpu.index,
                        "health_before": before["health"],
                        "health": health,
                        "last_error": error,
                    }
                )

        out_of_service = node.state in (NodeState.FAILED, NodeState.IN_REPAIR)
        if failures and not out_of_service:
            # Both lock the node again (already ours) and bump the rack version
            # themselves, as the last thing they do; nothing is written after.
            node = mark_node_failed(
                agent, node.pk, reason=_truncate("; ".join(failures), 250) + " (reported by its agent)"
            )
        elif node.state == NodeState.SUSPECT and all(
            g.health == GpuHealth.OK for g in GPU.objects.filter(node=node)
        ):
            node = return_node_to_service(agent, node.pk, reason="heartbeat resumed")
        elif to_drain and node.state == NodeState.HEALTHY:
            # A health rule's drain: no new work; drained when its jobs end, and
            # the long ones are proposed a move off it (decisions.evacuation).
            node = drain_node(agent, node.pk, reason=_truncate("; ".join(to_drain), 250) + " (health rule)")
            dispatch.after_commit("fleet.tasks.plan_evacuations")
        elif gpus_written:
            # A GPU degraded by an XID or the agent (not by a rule's verdict, which
            # decides for itself) is a warning an operator decides on.
            degraded = [
                c
                for c in changed
                if c["health"] == GpuHealth.DEGRADED and not judged.get(c["index"], ("",))[0]
            ]
            if degraded and node.state == NodeState.HEALTHY:
                _propose_drain(node, degraded)
            # A bare heartbeat bumps nothing: live views would re-fetch every rack
            # every few seconds for a timestamp.
            bump_versions([node.rack_id])
    return {
        "node_id": node.pk,
        "hostname": node.hostname,
        "node_state_before": state_before,
        "node_state": node.state,
        "last_heartbeat_at": now,
        "agent_version": version,
        "gpus_changed": changed,
    }


# A reading is stored at most this often unless a counter rose or was reset, or a
# flag or the fabric changed (heartbeats come every few seconds).
READING_EVERY_S = 60.0
# Signals whose change is stored at once (not counters: those rise).
_FLAGS = ("clock_event_reasons", "remapped_rows", "retired_pages", "fabric")


def _store_readings(
    node: Node, gpus: dict[int, GPU], reports: list[GpuReport], imex: Any, now: datetime
) -> dict[int, tuple[str, str]]:
    """Fold each GPU's signals into its reading (counter totals across resets,
    the sample rings) and store what is due, with the health rules' verdict
    on it; the node's IMEX status and fabric identity likewise. Under the
    node's lock (the caller's). Returns the verdict and its reason by GPU
    index, for GPUs that have a reading (between stores: the stored one)."""
    at = now.timestamp()
    readings = {r.gpu_id: r for r in GpuReading.objects.filter(gpu__node=node)}
    fabric: dict[str, Any] = {}
    seen: dict[tuple[str, Any], None] = {}  # distinct fabrics with a cluster, in GPU order
    rules: list[verdicts.Rule] | None = None
    judged: dict[int, tuple[str, str]] = {}
    for report in reports:
        if report.signals is None:
            continue
        gpu = gpus[report.index]
        reading = readings.get(gpu.pk) or GpuReading(gpu=gpu, read_at=now)
        changed = signals.advance(reading.state, signals.counters_of(report.signals), at)
        changed = changed or reading.pk is None or reading.unsupported != report.unsupported
        changed = changed or any(reading.signals.get(k) != report.signals.get(k) for k in _FLAGS)
        if changed or at - reading.read_at.timestamp() >= READING_EVERY_S:
            signals.sample(reading.state, at, report.temperature_c, report.signals.get("power_w"))
            reading.read_at, reading.temperature_c = now, report.temperature_c
            reading.signals, reading.unsupported = report.signals, report.unsupported
            rules = rule_services.active_rules() if rules is None else rules
            verdict_before = reading.verdict
            reading.verdict, reading.verdict_reason = verdicts.evaluate(
                rules, reading.signals, reading.state, reading.temperature_c, at
            )
            reading.verdict_reason = _truncate(reading.verdict_reason, 500)
            reading.save()
            if reading.verdict and reading.verdict != verdict_before:
                webhooks.emit("gpu.verdict", webhooks.gpu_verdict(gpu, node, reading))
        judged[report.index] = (reading.verdict, reading.verdict_reason)
        reported = report.signals.get("fabric") or {}
        if reported.get("cluster_uuid"):
            seen.setdefault((str(reported["cluster_uuid"]).lower(), reported.get("clique_id")))
        # The node's fabric: the first GPU's that is in a cluster, else the first GPU's.
        if reported and (not fabric or (reported.get("cluster_uuid") and not fabric.get("cluster_uuid"))):
            fabric = reported
    if imex is None and not fabric:
        return judged
    imex = imex or {}
    node_reading, _ = NodeReading.objects.get_or_create(node=node, defaults={"read_at": now})
    trouble = _fabric_trouble(reports, imex, judged)
    disagreement = [list(f) for f in seen] if len(seen) > 1 else []
    after = {
        "fabric_trouble": trouble,
        "imex_status": imex.get("status", node_reading.imex_status),
        "imex_detail": imex.get("detail", node_reading.imex_detail)[:500],
        "fabric_cluster_uuid": fabric.get("cluster_uuid") or ""
        if fabric
        else node_reading.fabric_cluster_uuid,
        "fabric_clique_id": fabric.get("clique_id") if fabric else node_reading.fabric_clique_id,
        "fabric_disagreement": disagreement if fabric else node_reading.fabric_disagreement,
    }
    before = {k: getattr(node_reading, k) for k in after}
    if after != before or (now - node_reading.read_at).total_seconds() >= READING_EVERY_S:
        NodeReading.objects.filter(pk=node_reading.pk).update(read_at=now, **after)
    if bool(trouble) != bool(before["fabric_trouble"]):
        # Judged once the node's transaction commits (the rack's count reads it).
        transaction.on_commit(lambda: judge_rack_fabric(node.rack_id), robust=True)
    return judged


def _fabric_trouble(
    reports: list[GpuReport], imex: dict[str, Any], judged: dict[int, tuple[str, str]]
) -> str:
    """What this node reports wrong with its NVLink fabric ('' if nothing): IMEX
    down, a GPU's fabric health mask, a rule's verdict on NVLink or fabric signals."""
    found = []
    if imex.get("status") in ("not_ready", "unavailable"):
        found.append(f"IMEX {imex['status']}" + (f" ({imex['detail']})" if imex.get("detail") else ""))
    for report in reports:
        mask = ((report.signals or {}).get("fabric") or {}).get("health_mask")
        if mask:
            found.append(f"GPU {report.index} fabric health mask {mask:#x}")
        verdict, why = judged.get(report.index, ("", ""))
        if verdict and why.startswith(("nvlink.", "fabric.")) and not mask:
            found.append(f"GPU {report.index}: {why}")
    return _truncate("; ".join(found), 300)


def judge_rack_fabric(rack_id: int) -> bool:
    """Degrade a rack whose nodes report fabric trouble (at least
    ``RACKWISE_RACK_FABRIC_NODES`` of them), or clear it when none does any more.
    Counted under the rack's lock, so two nodes' heartbeats judge in turn."""
    with transaction.atomic():
        rack = Rack.objects.select_for_update().get(pk=rack_id)
        troubled = list(
            NodeReading.objects.filter(node__rack_id=rack_id)
            .exclude(fabric_trouble="")
            .order_by("node__slot")
            .values_list("node__hostname", "fabric_trouble")
        )
        if not troubled or (len(troubled) < settings.RACKWISE_RACK_FABRIC_NODES and not rack.fabric_degraded):
            return set_fabric_state(None, rack_id, "")
        # Degraded from the threshold up, and it stays so while any node is in
        # trouble; the reason names the nodes in trouble now.
        total = Node.objects.filter(rack_id=rack_id).count()
        detail = "; ".join(f"{host}: {why}" for host, why in troubled[:3])
        more = f"; and {len(troubled) - 3} more" if len(troubled) > 3 else ""
        reason = f"NVLink fabric degraded on {len(troubled)} of {total} nodes ({detail}{more})"
        if len(troubled) < settings.RACKWISE_RACK_FABRIC_NODES:
            reason += "; it stays degraded until no node reports trouble"
        return set_fabric_state(None, rack_id, reason)


def _resume_after_refused_report(node_id: int, refused: InvalidInput) -> None:
    """A node whose report was refused still spoke. If silence had made it
    suspect and its GPUs were all fine when last heard of, it is healthy again,
    as a valid heartbeat would make it; otherwise nothing changes (the GPU
    health the report would have set is unknown). Not audited per heartbeat: a
    buggy agent would flood the log; a warning goes to the server log instead."""
    log.warning("node %s: heartbeat report refused (liveness recorded): %s", node_id, refused)
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if (
            node.state != NodeState.SUSPECT
            or GPU.objects.filter(node=node).exclude(health=GpuHealth.OK).exists()
        ):
            return
        agent = AgentPrincipal(node_id=node.pk, hostname=node.hostname)
        try:
            return_node_to_service(
                agent, node.pk, reason="heartbeat resumed (its GPU report was refused: a 400)"
            )
        except ClusterDown as exc:
            # The refused report is the answer (400); the node stays suspect
            # until a heartbeat finds the cluster answering.
            log.warning("node %s stays suspect: %s", node_id, exc)


def _propose_drain(node: Node, degraded: list[dict[str, Any]]) -> None:
    """A GPU that degrades without failing is a warning: propose draining the node
    (its jobs finish, no new work lands), once, for an operator to decide."""
    if Action.objects.filter(
        kind=ActionKind.DRAIN, state__in=OPEN_ACTION_STATES, plan__steps__0__node=node.pk
    ).exists():
        return
    why = "; ".join(f"GPU {c['index']}: {c['last_error'] or 'degraded'}" for c in degraded)
    propose(
        kind=ActionKind.DRAIN,
        title=f"drain {node.hostname}: {why}"[:300],
        steps=[Drain(node=node.pk, hostname=node.hostname, reason=f"degraded GPU ({why})"[:250])],
        jobs=[],
        benefit={"reason": "jobs on the node finish in place; no new work lands on a degrading GPU"},
    )


# --- silence --------------------------------------------------------------------------


def _mark_suspect(node_id: int, cutoff: datetime, now: datetime) -> bool:
    """healthy -> suspect, if the node is still healthy and still silent once
    locked. False if it changed state or sent a heartbeat since it was selected."""
    reason = f"no heartbeat for over {settings.RACKWISE_HEARTBEAT_SUSPECT_S}s"
    node = node_lifecycle.transition(
        None,
        node_id,
        "suspect",
        reason=reason,
        where={"state": NodeState.HEALTHY, "last_heartbeat_at__lt": cutoff},
        now=now,
    )
    return node is not None


def _fail_silent(node_id: int, cutoff: datetime, suspect_since: datetime) -> bool:
    """suspect -> failed, if the node is still suspect and still silent once locked
    (a heartbeat may have returned it to service since it was selected). A
    cluster that cannot be told leaves the node suspect; the next pass tries
    again."""
    try:
        return _fail_silent_now(node_id, cutoff, suspect_since)
    except ClusterDown as exc:
        log.warning("node %s stays suspect: %s", node_id, exc)
        return False


def _fail_silent_now(node_id: int, cutoff: datetime, suspect_since: datetime) -> bool:
    with transaction.atomic():
        node = (
            Node.objects.select_for_update()
            .filter(
                id=node_id,
                state=NodeState.SUSPECT,
                last_heartbeat_at__lt=cutoff,
                state_changed_at__lte=suspect_since,
            )
            .first()
        )
        if node is None:
            return False
        mark_node_failed(
            None, node.pk, reason=f"no heartbeat for over {settings.RACKWISE_HEARTBEAT_FAILED_S}s"
        )
    return True


def detect_failures(now: datetime | None = None) -> dict[str, int]:
    """One pass of silence detection; idempotent, safe to run from several workers.

    Nodes that never sent a heartbeat have no agent and are not monitored.

    1. A suspect node silent for over ``RACKWISE_HEARTBEAT_FAILED_S`` is failed,
       provided it has been suspect for the difference of the two limits. That
       way every node passes through a suspect period in which a heartbeat can
       still save it, even when this check (or the whole server) was down for a
       while and every node looks silent at once.
    2. A healthy node silent for over ``RACKWISE_HEARTBEAT_SUSPECT_S`` becomes
       suspect. This runs second so one pass never takes a node from healthy to
       failed.

    Returns ``{"suspect": n, "failed": m}``, the nodes changed by this pass.
    """
    now = now or timezone.now()
    suspect_s = settings.RACKWISE_HEARTBEAT_SUSPECT_S
    failed_s = settings.RACKWISE_HEARTBEAT_FAILED_S
    failed_cutoff = now - timedelta(seconds=failed_s)
    suspect_since = now - timedelta(seconds=max(failed_s - suspect_s, 0))
    failed = sum(
        _fail_silent(node_id, failed_cutoff, suspect_since)
        for node_id in Node.objects.filter(
            state=NodeState.SUSPECT, last_heartbeat_at__lt=failed_cutoff
        ).values_list("id", flat=True)
    )
    suspect_cutoff = now - timedelta(seconds=suspect_s)
    suspect = sum(
        _mark_suspect(node_id, suspect_cutoff, now)
        for node_id in Node.objects.filter(
            state=NodeState.HEALTHY, last_heartbeat_at__lt=suspect_cutoff
        ).values_list("id", flat=True)
    )
    return {"suspect": suspect, "failed": failed}
