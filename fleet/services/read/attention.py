"""What needs a person now: the console's nav badge, the Fleet page's banner and
``GET /api/attention/``. Each entry counts things and links to where to act on
them; the reader sees only what the permissions let them see."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Min
from django.urls import reverse
from django.utils import timezone

from fleet.choices import ActionState, JobState, NodeState
from fleet.fabric_identity import GPUS_DISAGREE, OTHER_CLIQUE, Mismatch
from fleet.models import Action, Job, Node, Rack
from fleet.permissions import visible_actions, visible_jobs
from fleet.services.read.fabric import fabric_mismatches

NODE_STATES = (NodeState.SUSPECT, NodeState.FAILED, NodeState.IN_REPAIR)
# Nodes whose fabric disagrees with their rack's: how many the answer lists, and
# the item's text names.
MISMATCHES_LISTED = 50
MISMATCHES_NAMED = 5


def age_text(seconds: float) -> str:
    """A wait in the console's words: 45 s, 12 min, 3 h 5 min, 2 d 4 h."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def awaiting_approval(user, now: datetime | None = None) -> dict:
    """Proposed actions the user may see: how many, and the oldest's id and age.
    (Cheap: one aggregate; the nav badge asks it on every page.)"""
    now = now or timezone.now()
    proposed = visible_actions(user, Action.objects.filter(state=ActionState.PROPOSED))
    oldest = proposed.order_by("created_at", "id").values("id", "created_at").first()
    count = proposed.count() if oldest else 0
    age = (now - oldest["created_at"]).total_seconds() if oldest else 0.0
    return {
        "count": count,
        "oldest_id": oldest["id"] if oldest else None,
        "oldest_age_s": round(age),
        "oldest_age": age_text(age) if oldest else "",
    }


def attention(user, now: datetime | None = None) -> dict:
    """Everything that needs a person, as counts with a link each.

    * racks with a degraded NVLink fabric (first: they fail a rack's gangs at once);
    * nodes whose NVLink fabric disagrees with the rack they are recorded in
      (miswired or misconfigured: a gang placed "in that rack" would not share
      one fabric), with their rack and the rack their fabric says;
    * actions awaiting approval (the oldest's age);
    * jobs recovering from a failure;
    * pending jobs that waited longer than ``RACKWISE_WAIT_WARN_S``;
    * nodes suspect, failed or in repair.
    ``items`` lists the non-zero ones in that order, with the text and the link
    the console shows."""
    now = now or timezone.now()
    warn_s = settings.RACKWISE_WAIT_WARN_S
    approval = awaiting_approval(user, now)
    jobs = visible_jobs(user, Job.objects.all())
    recovering = jobs.filter(state=JobState.RECOVERING).count()
    long_waits = jobs.filter(
        state=JobState.PENDING, submitted_at__lt=now - timedelta(seconds=warn_s)
    ).aggregate(n=Count("id"), oldest=Min("submitted_at"))
    nodes: dict[str, int] = {s: 0 for s in NODE_STATES}
    for row in Node.objects.filter(state__in=NODE_STATES).values("state").annotate(n=Count("id")):
        nodes[row["state"]] = row["n"]

    actions_url, jobs_url = reverse("actions"), reverse("jobs")
    items = []
    # First: a rack whose NVLink fabric is degraded fails a whole rack's gangs at once.
    degraded = list(Rack.objects.exclude(fabric_degraded="").order_by("name").values_list("id", "name"))
    if degraded:
        names = ", ".join(name for _, name in degraded[:5]) + (" and more" if len(degraded) > 5 else "")
        items.append(
            {
                "key": "racks_degraded",
                "count": len(degraded),
                "text": f"{len(degraded)} rack{'s' if len(degraded) != 1 else ''} with a degraded NVLink "
                f"fabric ({names}): no new gangs there",
                "url": reverse("rack", args=[degraded[0][0]]),
            }
        )
    mismatched = fabric_mismatches(now)
    if mismatched:
        n = len(mismatched)
        named = ", ".join(_mismatch_words(m) for m in mismatched[:MISMATCHES_NAMED])
        more = f" and {n - MISMATCHES_NAMED} more" if n > MISMATCHES_NAMED else ""
        items.append(
            {
                "key": "fabric_mismatch",
                "count": n,
                "text": f"{n} node{'s' if n != 1 else ''} whose NVLink fabric disagrees with "
                f"{'their rack' if n != 1 else 'its rack'}: {named}{more}",
                "url": reverse("rack", args=[mismatched[0].rack_id]),
            }
        )
    if approval["count"]:
        items.append(
            {
                "key": "approval",
                "count": approval["count"],
                "text": f"{approval['count']} awaiting approval, the oldest for {approval['oldest_age']}",
                "url": f"{actions_url}?state=proposed#action-{approval['oldest_id']}",
            }
        )
    if recovering:
        items.append(
            {
                "key": "recovering",
                "count": recovering,
                "text": f"{recovering} job{'s' if recovering != 1 else ''} recovering from a failure",
                "url": f"{jobs_url}?state={JobState.RECOVERING}",
            }
        )
    if long_waits["n"]:
        n = long_waits["n"]
        items.append(
            {
                "key": "waiting",
                "count": n,
                "text": f"{n} job{'s' if n != 1 else ''} waiting longer than {age_text(warn_s)}, "
                f"the longest for {age_text((now - long_waits['oldest']).total_seconds())}",
                "url": f"{jobs_url}?state={JobState.PENDING}",
            }
        )
    for state in NODE_STATES:
        if nodes[state]:
            label = NodeState(state).label.lower()
            items.append(
                {
                    "key": f"nodes_{state}",
                    "count": nodes[state],
                    "text": f"{nodes[state]} node{'s' if nodes[state] != 1 else ''} {label}",
                    "url": f"{reverse('home')}?state={state}",
                }
            )
    return {
        "awaiting_approval": approval,
        "jobs_recovering": recovering,
        "jobs_waiting_long": long_waits["n"],
        "wait_warn_s": warn_s,
        "nodes": nodes,
        "racks_degraded": len(degraded),
        "fabric_mismatch": len(mismatched),
        "fabric_mismatches": [m.as_dict() for m in mismatched[:MISMATCHES_LISTED]],
        "items": items,
    }


def _mismatch_words(m: Mismatch) -> str:
    if m.kind == GPUS_DISAGREE:
        return f"{m.hostname} (in {m.rack}: its GPUs disagree)"
    if m.kind == OTHER_CLIQUE:
        return f"{m.hostname} (in {m.rack}: another clique)"
    return f"{m.hostname} (in {m.rack}, fabric of {m.fabric_rack or 'no recorded rack'})"
