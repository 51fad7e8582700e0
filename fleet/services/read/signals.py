"""Health signals as the agents last read them: a node's, with counter rates and
the samples sparklines draw (``GET /api/nodes/<id>/signals/``); a rack's nodes at
a glance with the verdicts in force (``GET /api/racks/<id>/signals/``, the rack
page); and the latest reading of every GPU for ``/metrics``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from fleet import gpu_signals as signals
from fleet import gpu_verdicts as verdict_rules
from fleet.choices import GpuHealth, NodeState
from fleet.models import GPU, GpuReading, Node, NodeReading, Rack
from fleet.services.read.fabric import node_mismatch

# Windows the rates are given over (seconds), by name.
RATE_WINDOWS = {"10m": 600.0, "1h": 3600.0, "24h": 86400.0}


def gpu_signals(reading: GpuReading | None, now: float) -> dict | None:
    if reading is None:
        return None
    state = reading.state or {}
    counters = state.get("counters", {})
    return {
        "read_at": reading.read_at,
        "temperature_c": reading.temperature_c,
        "signals": reading.signals,
        "unsupported": reading.unsupported,
        "counters": {
            name: {
                "value": c["last"],
                "resets": c["resets"],
                "per_hour": {
                    w: _round(signals.rate_per_hour(state, name, s, now)) for w, s in RATE_WINDOWS.items()
                },
            }
            for name, c in sorted(counters.items())
        },
        # The last hour, a sample a minute: [epoch s, temperature C, power W].
        "samples": [[s[0], s[2], s[3]] for s in state.get("minutes", [])],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def node_signals(node_id: int) -> dict:
    """The node's readings, and ``fabric_mismatch``: how the fabric its GPUs
    report disagrees with its rack's (fleet.fabric_identity), or None."""
    now = timezone.now().timestamp()
    mismatch = node_mismatch(Node.objects.select_related("rack").get(pk=node_id))
    readings = {r.gpu_id: r for r in GpuReading.objects.filter(gpu__node_id=node_id)}
    node = NodeReading.objects.filter(node_id=node_id).first()
    return {
        "node_id": node_id,
        "imex": None if node is None else {"status": node.imex_status, "detail": node.imex_detail},
        "fabric": None
        if node is None
        else {"cluster_uuid": node.fabric_cluster_uuid, "clique_id": node.fabric_clique_id},
        "fabric_mismatch": None if mismatch is None else mismatch.as_dict(),
        "gpus": [
            {"index": gpu.index, "health": gpu.health, "reading": gpu_signals(readings.get(gpu.pk), now)}
            for gpu in GPU.objects.filter(node_id=node_id).order_by("index")
        ],
    }


# --- a rack at a glance (the rack page, GET /api/racks/<id>/signals/) -------------------

# Clock-event reasons that are no news: an idle GPU, clocks an operator set.
QUIET_CLOCK_EVENTS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
# Flags worth a word when set.
FLAGS = ("remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending")
# A GPU's reading for the summary: its latest values and the minute ring only
# (the hour ring, two days of samples, stays in the database).
_GPU_FIELDS = (
    "id",
    "node_id",
    "index",
    "health",
    "last_error",
    "reading__read_at",
    "reading__temperature_c",
    "reading__signals",
    "reading__verdict",
    "reading__verdict_reason",
    "reading__state__counters",
    "reading__state__minutes",
)


def _rising(gpus: list[dict], now: float) -> list[dict]:
    """Counters that rose, summed over the node's GPUs: per hour over the last
    hour (over the last 10 min while less than half an hour is seen), and which
    GPUs. A lifetime ECC counter is left out when its volatile twin says the same."""
    by_name: dict[str, dict] = {}
    for gpu in gpus:
        state = {"counters": gpu["counters"], "minutes": gpu["minutes"]}
        for name in gpu["counters"]:
            window = "1h"
            rate = signals.rate_per_hour(state, name, RATE_WINDOWS["1h"], now)
            if rate is None:
                window, rate = "10m", signals.rate_per_hour(state, name, RATE_WINDOWS["10m"], now)
            if not rate:
                continue
            entry = by_name.setdefault(name, {"counter": name, "per_hour": 0.0, "window": window, "gpus": []})
            entry["per_hour"] += rate
            entry["gpus"].append(gpu["index"])
            if window == "10m":
                entry["window"] = "10m"
    for kind in ("corrected", "uncorrected"):
        if f"ecc.volatile_{kind}" in by_name:
            by_name.pop(f"ecc.aggregate_{kind}", None)
    return [e | {"per_hour": round(e["per_hour"], 3)} for _, e in sorted(by_name.items())]


def _by_gpu(pairs: list[tuple[str, int]], key: str) -> list[dict]:
    out: dict[str, list[int]] = {}
    for name, index in pairs:
        out.setdefault(name, []).append(index)
    return [{key: name, "gpus": indices} for name, indices in sorted(out.items())]


def _node_samples(gpus: list[dict]) -> list[list]:
    """The node's last hour, a point a minute: [epoch s, hottest GPU C, power W
    of its GPUs together]. The GPUs of a node are sampled in the same heartbeat;
    samples are matched by their minute."""
    minutes: dict[int, list] = {}
    for gpu in gpus:
        for at, _, temperature, power in gpu["minutes"]:
            point = minutes.setdefault(int(at // 60), [at, None, None])
            if temperature is not None:
                point[1] = temperature if point[1] is None else max(point[1], temperature)
            if power is not None:
                point[2] = round(power + (point[2] or 0.0), 1)
    return [minutes[k] for k in sorted(minutes)]


def _verdicts(gpus: list[dict]) -> list[dict]:
    """The verdicts on a node's GPUs, worst first; GPUs with the same verdict
    for the same reason together."""
    groups: dict[tuple[str, str], list[int]] = {}
    for g in gpus:
        if g["verdict"]:
            groups.setdefault((g["verdict"], g["verdict_reason"]), []).append(g["index"])
    ordered = sorted(groups.items(), key=lambda kv: (-verdict_rules.SEVERITY.get(kv[0][0], 0), kv[1][0]))
    return [{"verdict": v, "reason": why, "gpus": indices} for (v, why), indices in ordered]


def _node_summary(
    node: Mapping[str, Any], gpus: list[dict], reading: Mapping[str, Any] | None, now: float
) -> dict:
    read = [g for g in gpus if g["read_at"] is not None]
    temps = [(g["temperature_c"], g["index"]) for g in read if g["temperature_c"] is not None]
    powers = [g["signals"].get("power_w") for g in read]
    hottest = max(temps, default=None)
    events, flags = [], []
    for g in read:
        for reason in g["signals"].get("clock_event_reasons") or []:
            events.append((reason, g["index"]))
        for flag in FLAGS:
            group, _, key = flag.partition(".")
            if (g["signals"].get(group) or {}).get(key) is True:
                flags.append((flag, g["index"]))
    fabric = None
    if reading is not None:
        fabric = {
            "imex_status": reading["imex_status"],
            "imex_detail": reading["imex_detail"],
            "clique_id": reading["fabric_clique_id"],
            "trouble": reading["fabric_trouble"],
        }
    return {
        "node_id": node["id"],
        "slot": node["slot"],
        "hostname": node["hostname"],
        "state": node["state"],
        "state_reason": node["state_reason"],
        # The node's own drain: a health rule's verdict took it out of new work.
        "drained_by_rule": node["state"] in (NodeState.DRAINING, NodeState.DRAINED)
        and node["state_reason"].endswith("(health rule)"),
        "read_at": max((g["read_at"] for g in read), default=None),
        "gpus_reporting": len(read),
        "hottest": None if hottest is None else {"gpu": hottest[1], "temperature_c": hottest[0]},
        "power_w": round(sum(p for p in powers if isinstance(p, int | float)), 1)
        if any(isinstance(p, int | float) for p in powers)
        else None,
        "clock_events": [e | {"quiet": e["reason"] in QUIET_CLOCK_EVENTS} for e in _by_gpu(events, "reason")],
        "flags": _by_gpu(flags, "flag"),
        "rising": _rising(read, now),
        "fabric": fabric,
        "verdicts": _verdicts(read),
        "gpus_unwell": [
            {"gpu": g["index"], "health": g["health"], "error": g["last_error"]}
            for g in gpus
            # A verdict is listed above with its reason (it made the GPU unwell).
            if g["health"] != GpuHealth.OK and not g["verdict"]
        ],
        "samples": _node_samples(read),
    }


def rack_signals(rack_id: int) -> dict:
    """Every node of a rack at a glance: its latest signals (hottest GPU, power,
    clock events, flags set, counters rising, fabric), the last hour's hottest
    temperature and power a minute, and the verdicts in force with their reasons.
    Four queries whatever the rack's size (the rack, its nodes, its GPUs with their
    readings, its nodes' readings). A node whose agent sent no signals has
    ``read_at`` null. Raises Rack.DoesNotExist."""
    now = timezone.now().timestamp()
    rack = Rack.objects.values("id", "name", "fabric_degraded").get(pk=rack_id)
    nodes = list(
        Node.objects.filter(rack_id=rack_id)
        .order_by("slot")
        .values("id", "slot", "hostname", "state", "state_reason")
    )
    gpus: dict[int, list[dict]] = {n["id"]: [] for n in nodes}
    for row in GPU.objects.filter(node__rack_id=rack_id).order_by("node_id", "index").values(*_GPU_FIELDS):
        gpus[row["node_id"]].append(
            {
                "index": row["index"],
                "health": row["health"],
                "last_error": row["last_error"],
                "read_at": row["reading__read_at"],
                "temperature_c": row["reading__temperature_c"],
                "signals": row["reading__signals"] or {},
                "verdict": row["reading__verdict"] or "",
                "verdict_reason": row["reading__verdict_reason"] or "",
                "counters": row["reading__state__counters"] or {},
                "minutes": row["reading__state__minutes"] or [],
            }
        )
    readings = {
        r["node_id"]: r
        for r in NodeReading.objects.filter(node__rack_id=rack_id).values(
            "node_id", "imex_status", "imex_detail", "fabric_clique_id", "fabric_trouble"
        )
    }
    summaries = [_node_summary(n, gpus[n["id"]], readings.get(n["id"]), now) for n in nodes]
    verdicts: dict[str, int] = {}
    for summary in summaries:
        for v in summary["verdicts"]:
            verdicts[v["verdict"]] = verdicts.get(v["verdict"], 0) + len(v["gpus"])
    return {
        "rack_id": rack["id"],
        "name": rack["name"],
        "fabric_degraded": rack["fabric_degraded"],
        "verdicts": verdicts,
        "nodes": summaries,
    }


# --- /metrics -------------------------------------------------------------------------


def latest_gpu_readings() -> list[dict]:
    """The latest reading of every GPU that has one, one query: ``rack``,
    ``node`` (host name), ``gpu`` (index), ``temperature_c``, ``signals`` (as the
    agent sent them; ``counters`` flattened by fleet.gpu_signals.counters_of:
    NVML's cumulative values, NVLink summed over links) and ``verdict``."""
    rows = GpuReading.objects.order_by("gpu__node__rack__name", "gpu__node__slot", "gpu__index").values_list(
        "gpu__node__rack__name", "gpu__node__hostname", "gpu__index", "temperature_c", "signals", "verdict"
    )
    return [
        {
            "rack": rack,
            "node": node,
            "gpu": index,
            "temperature_c": temperature,
            "signals": sig or {},
            "counters": signals.counters_of(sig or {}),
            "verdict": verdict,
        }
        for rack, node, index, temperature, sig, verdict in rows
    ]


def rack_fabric_states() -> list[tuple[str, bool]]:
    """(rack name, whether its NVLink fabric is degraded) of every rack."""
    return [
        (name, bool(degraded))
        for name, degraded in Rack.objects.order_by("name").values_list("name", "fabric_degraded")
    ]
