"""``/metrics`` in the Prometheus text format.

The collector reads the database (and the broker's queue lengths) at scrape
time, with grouped queries, so every web process answers the same figures as
any other and the workers need no metrics endpoint of their own. Nothing is
kept in process memory.

Access: a request carrying ``Authorization: Bearer <RACKWISE_METRICS_TOKEN>``,
or one from an address in ``RACKWISE_METRICS_ALLOW`` (loopback only by
default). Anything else gets 401 (a token is configured: present it) or 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator
from datetime import timedelta

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from fleet import locks
from fleet.choices import ActionKind, ActionState, DeliveryState, JobState
from fleet.models import Action, Job, Node, WebhookDelivery
from fleet.services.read import read_models
from fleet.services.read.signals import latest_gpu_readings, rack_fabric_states
from fleet.services.read.tenants import tenant_figures

log = logging.getLogger(__name__)

# Upper bounds (seconds) of the submitted-to-placed wait histogram: seconds for
# an idle fleet up to a day for a big gang behind a full one.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
RECOVERY_KINDS = (ActionKind.RECOVERY, ActionKind.PREEMPTION, ActionKind.MIGRATION, ActionKind.REQUEUE)
FINISHED_ACTION_STATES = (
    ActionState.SUCCEEDED,
    ActionState.FAILED,
    ActionState.REJECTED,
    ActionState.EXPIRED,
    ActionState.CANCELLED,
)
GPU_STATES = ("used", "free", "failed", "unavailable")
# The kinds of rackwise_tenant_gpus: tenant_figures' per-shape figures ("<kind>_gpus").
TENANT_GPU_KINDS = ("nominal", "in_use", "borrowed", "lent", "fair_share")


class FleetCollector(Collector):
    """Every Rackwise metric family, computed from the database at scrape time."""

    def collect(self) -> Iterator:
        summary = read_models.summary()  # one read for capacity and jobs by state
        yield from self._capacity(summary)
        yield from self._fragmentation()
        yield from self._jobs(summary["jobs_by_state"])
        yield self._wait_histogram()
        yield from self._actions()
        yield from self._alerting()
        yield self._heartbeats()
        yield from self._gpu_health()
        yield from self._tenants()
        yield from self._queues()

    def _capacity(self, summary: dict) -> Iterator:
        gpus = GaugeMetricFamily(
            "rackwise_gpus", "GPUs by state (used, free, failed, unavailable).", labels=["state"]
        )
        for state in GPU_STATES:
            gpus.add_metric([state], summary[f"gpus_{state}"])
        yield gpus
        yield GaugeMetricFamily("rackwise_gpus_total", "GPUs in the fleet.", value=summary["gpus_total"])
        nodes = GaugeMetricFamily("rackwise_nodes", "Nodes by state.", labels=["state"])
        for state, n in summary["nodes_by_state"].items():
            nodes.add_metric([state], n)
        yield nodes
        yield GaugeMetricFamily("rackwise_racks", "Racks (NVLink domains).", value=summary["racks"])
        yield GaugeMetricFamily(
            "rackwise_utilization", "GPUs used over GPUs in the fleet, 0..1.", value=summary["utilization"]
        )
        yield GaugeMetricFamily(
            "rackwise_utilization_of_usable",
            "GPUs used over GPUs not failed, 0..1.",
            value=summary["utilization_of_usable"],
        )

    def _fragmentation(self) -> Iterator:
        # The read model every other view of the figure reads (console header,
        # Fleet chart, /api/fleet/fragmentation/): one definition, one number.
        report = read_models.fragmentation()
        yield GaugeMetricFamily(
            "rackwise_fragmentation",
            "Share of free GPUs, spares kept for recovery left out, that the typical multi-node job cannot "
            "use: on partly used nodes or in racks whose free slice is smaller than its share, 0..1.",
            value=report.fraction,
        )
        yield GaugeMetricFamily(
            "rackwise_fragmented_gpus",
            "Free GPUs the typical multi-node job cannot use (the fragmentation's numerator).",
            value=report.fragmented_gpus,
        )
        yield GaugeMetricFamily(
            "rackwise_largest_placeable_job_gpus",
            "GPUs of the largest free slice: the largest rack-local gang placeable now, spares kept.",
            value=report.largest_job_gpus,
        )

    def _jobs(self, jobs_by_state: dict[str, int]) -> Iterator:
        by_state = GaugeMetricFamily("rackwise_jobs", "Jobs by state.", labels=["state"])
        for state, n in jobs_by_state.items():
            by_state.add_metric([state], n)
        yield by_state
        pending = GaugeMetricFamily(
            "rackwise_pending_jobs",
            "Pending jobs by shape: nodes (1 for a job sharing a node) and GPUs in all.",
            labels=["nodes", "gpus"],
        )
        shapes: dict[tuple[str, str], int] = {}
        for row in (
            Job.objects.filter(state=JobState.PENDING).values("num_nodes", "num_gpus").annotate(n=Count("id"))
        ):
            key = (str(row["num_nodes"] or 1), str(row["num_gpus"]))
            shapes[key] = shapes.get(key, 0) + row["n"]
        for key, n in sorted(shapes.items(), key=lambda kv: (int(kv[0][0]), int(kv[0][1]))):
            pending.add_metric(list(key), n)
        yield pending

    def _wait_histogram(self) -> HistogramMetricFamily:
        """Submitted-to-placed wait of every job that has been placed, as one
        aggregate query with a conditional count per bucket."""
        waited = Job.objects.annotate(
            wait=ExpressionWrapper(
                Coalesce("placed_at", "started_at") - F("submitted_at"), output_field=DurationField()
            )
        ).filter(wait__isnull=False)
        aggregates = {
            f"le_{i}": Count("id", filter=Q(wait__lte=timedelta(seconds=b)))
            for i, b in enumerate(WAIT_BUCKETS)
        }
        row = waited.aggregate(total=Count("id"), wait_sum=Sum("wait"), **aggregates)
        buckets = [(str(float(b)), row[f"le_{i}"]) for i, b in enumerate(WAIT_BUCKETS)]
        buckets.append(("+Inf", row["total"]))
        wait_sum = row["wait_sum"].total_seconds() if row["wait_sum"] else 0.0
        return HistogramMetricFamily(
            "rackwise_job_wait_seconds",
            "Time from submission to placement of every job placed so far.",
            buckets=buckets,
            sum_value=wait_sum,
        )

    def _actions(self) -> Iterator:
        counts = {(k, s): 0 for k in ActionKind.values for s in ActionState.values}
        for row in Action.objects.values("kind", "state").annotate(n=Count("id")):
            counts[(row["kind"], row["state"])] = row["n"]
        actions = GaugeMetricFamily(
            "rackwise_actions", "Actions (decisions) by kind and state.", labels=["kind", "state"]
        )
        for (kind, state), n in counts.items():
            actions.add_metric([kind, state], n)
        yield actions
        # Finished recovery actions only ever grow in number, so they are a counter.
        recoveries = CounterMetricFamily(
            "rackwise_recoveries",
            "Finished recovery decisions of jobs hit by failed nodes, by kind (recovery is an "
            "in-place swap) and outcome.",
            labels=["kind", "state"],
        )
        for kind in RECOVERY_KINDS:
            for state in FINISHED_ACTION_STATES:
                recoveries.add_metric([kind, state], counts[(kind, state)])
        yield recoveries

    def _alerting(self) -> Iterator:
        """The figures deploy/prometheus/rackwise-alerts.yml alerts on besides
        the others: how long the oldest proposal has waited for a decision, the
        webhook deliveries by state (dead ones gave up), and the decision leases
        lost (fleet.locks counts them in Redis)."""
        now = timezone.now()
        oldest = GaugeMetricFamily(
            "rackwise_action_oldest_proposed_seconds",
            "Seconds the oldest proposed action of each kind has waited for a decision (kinds with one).",
            labels=["kind"],
        )
        for row in (
            Action.objects.filter(state=ActionState.PROPOSED)
            .values("kind")
            .annotate(first=Min("created_at"))
            .order_by("kind")
        ):
            oldest.add_metric([row["kind"]], max(0.0, (now - row["first"]).total_seconds()))
        yield oldest
        deliveries = GaugeMetricFamily(
            "rackwise_webhook_deliveries",
            "Event webhook deliveries by state; dead ones gave up (RACKWISE_WEBHOOK_MAX_ATTEMPTS).",
            labels=["state"],
        )
        counts = dict.fromkeys(DeliveryState.values, 0)
        for row in WebhookDelivery.objects.values("state").annotate(n=Count("id")).order_by():
            counts[row["state"]] = row["n"]
        for state, n in counts.items():
            deliveries.add_metric([state], n)
        yield deliveries
        try:
            lost = locks.leases_lost()
        except (redis.exceptions.RedisError, OSError):
            log.warning("metrics: Redis does not answer; lost leases left out", exc_info=True)
        else:
            yield CounterMetricFamily(
                "rackwise_decision_leases_lost",
                "Decision-lock leases a pass lost before it finished (it stopped without committing).",
                value=lost,
            )

    def _heartbeats(self) -> GaugeMetricFamily:
        now = timezone.now()
        ages = GaugeMetricFamily(
            "rackwise_node_heartbeat_age_seconds",
            "Seconds since the node's agent last reported (nodes that have reported).",
            labels=["node", "rack"],
        )
        for hostname, rack, at in Node.objects.filter(last_heartbeat_at__isnull=False).values_list(
            "hostname", "rack__name", "last_heartbeat_at"
        ):
            ages.add_metric([hostname, rack], max(0.0, (now - at).total_seconds()))
        return ages

    def _gpu_health(self) -> Iterator:
        """Each GPU's latest reading from its agent (one series per GPU and
        kind, so as many series as GPUs that report: no history is kept here;
        ``RACKWISE_METRICS_GPU_SERIES`` off leaves them out), the health rules'
        verdicts in force, and each rack's fabric state. Two queries."""
        gpu = ["rack", "node", "gpu"]
        latest = " (the latest reading of each GPU that reports)"
        temperature = GaugeMetricFamily(
            "rackwise_gpu_temperature_celsius", "GPU temperature" + latest + ".", labels=gpu
        )
        power = GaugeMetricFamily("rackwise_gpu_power_watts", "GPU power draw" + latest + ".", labels=gpu)
        ecc = CounterMetricFamily(
            "rackwise_gpu_ecc_errors",
            "ECC errors since the driver loaded (NVML's volatile counters; a driver reload resets them), "
            "by kind (corrected, uncorrected)" + latest + ".",
            labels=[*gpu, "kind"],
        )
        remapped = GaugeMetricFamily(
            "rackwise_gpu_remapped_rows",
            "Memory rows remapped, by kind (correctable, uncorrectable)" + latest + ".",
            labels=[*gpu, "kind"],
        )
        pcie = CounterMetricFamily(
            "rackwise_gpu_pcie_replays", "PCIe replays as NVML counts them" + latest + ".", labels=gpu
        )
        nvlink = CounterMetricFamily(
            "rackwise_gpu_nvlink_errors",
            "NVLink errors summed over the GPU's links, by kind (replay, recovery, crc_flit, crc_data)"
            + latest
            + ".",
            labels=[*gpu, "kind"],
        )
        clock = GaugeMetricFamily(
            "rackwise_gpu_clock_event",
            "1 for each clock-event reason (throttle) active in the GPU's latest reading; reasons not "
            "active are left out, to bound the series.",
            labels=[*gpu, "reason"],
        )
        verdict = GaugeMetricFamily(
            "rackwise_gpu_verdict",
            "1 for each GPU a health rule gives a verdict (fail, drain, suspect) on its latest reading; "
            "GPUs without one are left out.",
            labels=[*gpu, "verdict"],
        )
        per_gpu = settings.RACKWISE_METRICS_GPU_SERIES
        for r in latest_gpu_readings():
            key = [r["rack"], r["node"], str(r["gpu"])]
            if r["verdict"]:
                verdict.add_metric([*key, r["verdict"]], 1)
            if not per_gpu:
                continue
            sig, counters = r["signals"], r["counters"]
            if r["temperature_c"] is not None:
                temperature.add_metric(key, r["temperature_c"])
            if isinstance(sig.get("power_w"), int | float):
                power.add_metric(key, sig["power_w"])
            for kind in ("corrected", "uncorrected"):
                if f"ecc.volatile_{kind}" in counters:
                    ecc.add_metric([*key, kind], counters[f"ecc.volatile_{kind}"])
            for kind in ("correctable", "uncorrectable"):
                if f"remapped_rows.{kind}" in counters:
                    remapped.add_metric([*key, kind], counters[f"remapped_rows.{kind}"])
            if "pcie_replay_count" in counters:
                pcie.add_metric(key, counters["pcie_replay_count"])
            for name, value in counters.items():
                if name.startswith("nvlink."):
                    nvlink.add_metric([*key, name.removeprefix("nvlink.")], value)
            for reason in sorted(set(sig.get("clock_event_reasons") or [])):
                clock.add_metric([*key, reason], 1)
        if per_gpu:
            yield from (temperature, power, ecc, remapped, pcie, nvlink, clock)
        yield verdict
        fabric = GaugeMetricFamily(
            "rackwise_rack_fabric_degraded",
            "1 if the rack's NVLink fabric is degraded (several of its nodes report fabric trouble; no new "
            "multi-node gangs go there), else 0.",
            labels=["rack"],
        )
        for name, degraded in rack_fabric_states():
            fabric.add_metric([name], int(degraded))
        yield fabric

    def _tenants(self) -> Iterator:
        # The read model the Tenants page and /api/tenants/ show: one definition.
        tenants = tenant_figures()
        gpus = GaugeMetricFamily(
            "rackwise_tenant_gpus",
            "A tenant's GPUs per node shape (GPUs per node): its nominal quota, what it holds (in_use), "
            "holds beyond its quota (borrowed), its idle quota others use now (lent), and its fair share "
            "of the cohort's GPUs now (fair_share).",
            labels=["tenant", "shape", "kind"],
        )
        pending = GaugeMetricFamily(
            "rackwise_tenant_pending_gpus",
            "GPUs asked for by a tenant's pending jobs, by the node shape each is charged to.",
            labels=["tenant", "shape"],
        )
        share = GaugeMetricFamily(
            "rackwise_tenant_fair_share",
            "A tenant's weight over all tenants' weights, 0..1.",
            labels=["tenant"],
        )
        usage = GaugeMetricFamily(
            "rackwise_tenant_decayed_gpu_hours",
            "GPU-hours a tenant used, halved per RACKWISE_FAIR_SHARE_HALF_LIFE_H gone by (fair-share order).",
            labels=["tenant"],
        )
        for t in tenants:
            for q in t["quotas"]:
                shape = str(q["gpus_per_node"])
                for kind in TENANT_GPU_KINDS:
                    gpus.add_metric([t["name"], shape, kind], q[f"{kind}_gpus"])
                pending.add_metric([t["name"], shape], q["pending_gpus"])
            share.add_metric([t["name"]], t["fair_share"])
            usage.add_metric([t["name"]], t["decayed_usage_gpu_hours"])
        yield from (gpus, pending, share, usage)

    def _queues(self) -> Iterator:
        depth = GaugeMetricFamily(
            "rackwise_task_queue_depth", "Celery messages waiting on the broker, by queue.", labels=["queue"]
        )
        up = 1
        try:
            for queue, n in queue_depths().items():
                depth.add_metric([queue], n)
        except (redis.exceptions.RedisError, OSError):
            log.warning("metrics: the broker does not answer; queue depth left out", exc_info=True)
            up = 0
        yield depth
        yield GaugeMetricFamily("rackwise_broker_up", "1 if the broker answered this scrape.", value=up)


def celery_queues() -> list[str]:
    """The queue names tasks go to: the default one and any routed to."""
    names = {getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery") or "celery"}
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    if isinstance(routes, dict):
        names |= {r["queue"] for r in routes.values() if isinstance(r, dict) and r.get("queue")}
    return sorted(names)


def queue_depths() -> dict[str, int]:
    """LLEN of each Celery queue on a Redis broker (an AMQP broker is not
    asked: its own exporter reports queue depth)."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return {}
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    # Kombu's Redis transport keeps one list per priority step: "name" for
    # priority 0 and "name\x06\x16<step>" for the others.
    sep, steps = "\x06\x16", (3, 6, 9)
    pipe = client.pipeline(transaction=False)
    queues = celery_queues()
    for q in queues:
        for key in (q, *(f"{q}{sep}{s}" for s in steps)):
            pipe.llen(key)
    lengths = pipe.execute()
    per = 1 + len(steps)
    return {q: sum(lengths[i * per : (i + 1) * per]) for i, q in enumerate(queues)}


def _registry() -> CollectorRegistry:
    # A private registry: only the fleet's figures, no per-process collectors,
    # which would differ between the web processes behind one address.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return registry


REGISTRY = _registry()


def scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    """None if the request may read the metrics, else the 401/403 to answer."""
    token = settings.RACKWISE_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        if hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode()):
            return None
        return _refuse(401, "wrong metrics token")
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        addr = None
    if addr is not None and any(addr in ipaddress.ip_network(n) for n in settings.RACKWISE_METRICS_ALLOW):
        return None
    if token:
        return _refuse(401, "metrics need 'Authorization: Bearer <RACKWISE_METRICS_TOKEN>'")
    return _refuse(
        403,
        f"metrics are not served to {addr or 'this address'}; set RACKWISE_METRICS_ALLOW "
        "(CIDRs) or RACKWISE_METRICS_TOKEN",
    )


def _refuse(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="rackwise-metrics"'
    return response


@login_not_required  # scrapers have no session; the token or the address is the check
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape endpoint."""
    refusal = scrape_refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
