"""The Node aggregate's lifecycle: the one writer of ``Node.state``.

Other services ask :func:`transition`, naming a move; they never write
``Node.state`` themselves, so every move gets the same lock, check, mirror to
the cluster, audit record and rack version.

========= =========================================== ================== ============ ==============
move      from                                        to                 audit        cluster told
========= =========================================== ================== ============ ==============
drain     healthy, suspect                            draining | drained node.drain   draining
undrain   draining, drained                           healthy            node.undrain healthy
fail      healthy, suspect, draining, drained         failed             node.fail    failed
return    failed, in_repair, suspect                  healthy            node.return  healthy
suspect   healthy (and silent past the cutoff)        suspect            node.suspect --
settle    draining (and holding no GPUs)              drained            node.drained --
========= =========================================== ================== ============ ==============

A drain ends draining while the node holds jobs' GPUs, drained once it holds
none. The last job's release (a job lifecycle move) asks for ``settle`` once
its transaction commits, in a transaction of its own that locks the node
first; a node another transaction holds then is left for reconcile, which
settles every emptied draining node (:func:`settle_drained_nodes`).

A move the cluster must know of is mirrored (``ClusterAdapter.set_node_state``)
with the node row locked, before the transaction commits: if the cluster cannot
take it, the move is refused (:class:`ClusterDown`, a 503) and nothing changes,
so Rackwise and the cluster never disagree for long. ``mirror=False`` is for
changes the cluster already has: a node step an adapter just carried out, or a
state the cluster itself reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet.choices import NodeState
from fleet.cluster.base import NODE_DRAINING, NODE_FAILED, NODE_HEALTHY, ClusterUnavailable, StepFailed
from fleet.cluster.registry import get_adapter
from fleet.models import Allocation, Node
from fleet.services import audit
from fleet.services.errors import ClusterDown, Conflict
from fleet.services.racks import bump_versions
from fleet.text import clip

N = NodeState


@dataclass(frozen=True)
class Move:
    """A move of the node lifecycle: where it may start and end, the state the
    cluster is told (a ``NODE_*``; None: not mirrored), the refusal's words."""

    name: str
    allowed_from: tuple[str, ...]
    to: tuple[str, ...]
    audit_action: str
    cluster_state: str | None
    refusal: str


MOVES: dict[str, Move] = {
    m.name: m
    for m in (
        Move(
            "drain",
            (N.HEALTHY, N.SUSPECT),
            (N.DRAINING, N.DRAINED),
            "node.drain",
            NODE_DRAINING,
            "only a healthy or suspect node can be drained",
        ),
        Move(
            "undrain",
            (N.DRAINING, N.DRAINED),
            (N.HEALTHY,),
            "node.undrain",
            NODE_HEALTHY,
            "only a draining or drained node can be undrained",
        ),
        Move(
            "fail",
            (N.HEALTHY, N.SUSPECT, N.DRAINING, N.DRAINED),
            (N.FAILED,),
            "node.fail",
            NODE_FAILED,
            "it is already out of service",
        ),
        Move(
            "return",
            (N.FAILED, N.IN_REPAIR, N.SUSPECT),
            (N.HEALTHY,),
            "node.return",
            NODE_HEALTHY,
            "only a failed, in-repair or suspect node can be returned to service "
            "(use undrain for a drained node)",
        ),
        Move(
            "suspect",
            (N.HEALTHY,),
            (N.SUSPECT,),
            "node.suspect",
            None,
            "only a healthy node can become suspect",
        ),
        Move(
            "settle",
            (N.DRAINING,),
            (N.DRAINED,),
            "node.drained",
            None,
            "only a draining node can become drained",
        ),
    )
}


def snapshot(node: Node) -> dict[str, str]:
    return {"state": node.state, "state_reason": node.state_reason}


def holds_gpus(node: Node) -> bool:
    return Allocation.objects.filter(gpu__node=node, released_at__isnull=True).exists()


def transition(
    actor,
    node_id: int,
    move: str,
    *,
    reason: str = "",
    keep_reason: bool = False,
    mirror: bool = True,
    where: dict[str, Any] | None = None,
    nowait: bool = False,
    effect: Callable[[Node], Iterable[int]] | None = None,
    now: datetime | None = None,
) -> Node | None:
    """Move node ``node_id`` by ``move`` (a key of :data:`MOVES`), in one transaction:

    1. lock the row (with ``where``, only if it still matches; with ``nowait``,
       only if no other transaction holds it); None if it does not or is held;
    2. check the move (Conflict, saying why); a settle needs the node empty
       (None if it is not); a drain ends drained on an empty node;
    3. tell the cluster (``mirror``), save (``reason`` as the node's, unless
       ``keep_reason``: a settled drain keeps the operator's; changed at
       ``now``, the caller's clock when it judged by time), audit;
    4. run ``effect`` (what follows in other aggregates, e.g. the jobs a
       failure interrupts; it returns their racks) and move the racks'
       versions last (rack rows are always locked last)."""
    spec = MOVES[move]
    with transaction.atomic():
        rows = Node.objects.select_for_update(skip_locked=nowait).filter(pk=node_id, **(where or {}))
        node = rows.first()
        if node is None:
            if where is None and not nowait:
                raise Node.DoesNotExist(f"no node {node_id}")
            return None
        if node.state not in spec.allowed_from:
            if where is not None:
                return None  # it changed since it was selected
            raise Conflict(f"node {node.hostname} is {node.state}; {spec.refusal}")
        busy = holds_gpus(node) if move in ("drain", "settle") else False
        if move == "settle" and busy:
            return None
        if mirror and spec.cluster_state is not None:
            mirror_node_state(node.hostname, spec.cluster_state, reason)
        before = snapshot(node)
        node.state = N.DRAINING if busy else spec.to[-1]
        if not keep_reason:
            node.state_reason = clip(reason)
        node.state_changed_at = now or timezone.now()
        node.save(update_fields=["state", "state_reason", "state_changed_at"])
        audit.record(actor, spec.audit_action, node, before=before, after=snapshot(node), message=reason)
        racks = set(effect(node)) if effect else set()
        bump_versions(racks | {node.rack_id})
    return node


def mirror_node_state(hostname: str, state: str, reason: str) -> None:
    """Tell the cluster of a node change Rackwise is about to commit. Raises
    ClusterDown (the cluster did not answer) or Conflict (it refused)."""
    try:
        get_adapter().set_node_state(hostname, state, reason)
    except ClusterUnavailable as exc:
        raise ClusterDown(f"the cluster is unavailable, node {hostname} was not changed: {exc}") from exc
    except StepFailed as exc:
        raise Conflict(f"the cluster refused the change of node {hostname}: {exc}") from exc


def idle_draining_nodes(node_ids: Iterable[int] | None = None) -> QuerySet[Node]:
    """Draining nodes (of ``node_ids``, or all) that hold no GPUs any more: the
    ones due to become drained."""
    idle = Node.objects.filter(state=N.DRAINING).exclude(
        id__in=Allocation.objects.filter(released_at__isnull=True).values("gpu__node_id")
    )
    return idle if node_ids is None else idle.filter(id__in=list(node_ids))


def settle_drained_nodes(node_ids: Iterable[int] | None = None, *, nowait: bool = False) -> list[int]:
    """Draining nodes (of ``node_ids``, or all) that hold no GPUs any more
    become drained, each in its own transaction. ``nowait``: skip a node
    another transaction holds (reconcile settles it). Returns the ids."""
    settled = []
    for node_id in idle_draining_nodes(node_ids).values_list("id", flat=True):
        node = transition(
            None,
            node_id,
            "settle",
            reason="its last job ended",
            keep_reason=True,
            where={"state": N.DRAINING},
            nowait=nowait,
        )
        if node is not None:
            settled.append(node.pk)
    return settled


def settle_after_commit(node_ids: Iterable[int]) -> None:
    """Once the current transaction commits, settle these nodes if they are
    draining and empty, without waiting for a node another transaction holds."""
    ids = sorted(set(node_ids))
    transaction.on_commit(lambda: settle_drained_nodes(ids, nowait=True), robust=True)
