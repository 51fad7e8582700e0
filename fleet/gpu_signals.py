"""The health signals a node agent reads from NVML, as they arrive in a heartbeat:
their shape and bounds, the cumulative counters among them, and the rates the
server works out from those counters.

The agent sends counters as NVML gives them (cumulative since the driver
loaded). The server keeps, per GPU and counter, the last value and a running
total of increases: a value below the last one is a reset (driver reload,
reboot), counted as a rise from zero, so a rate survives resets and agent
restarts alike. Totals are sampled into two rings (one a minute for an hour,
one an hour for two days) that rates over a window and the sparklines read.

Pure functions on plain data: :mod:`fleet.services.intake.health` validates and
stores, under the node's lock.
"""

from __future__ import annotations

import math
from typing import Any

from fleet import agent_signals

MAX_COUNT = 2**63 - 1  # NVML counters are unsigned 64-bit; PostgreSQL's JSON keeps them exact
MAX_LINKS = 64
MAX_TEXT = 100
# The vocabulary is the agent's (fleet.agent_signals): one definition for sender and receiver.
CLOCK_EVENT_REASONS = frozenset(name for _, name in agent_signals.CLOCK_EVENT_REASONS)
SIGNAL_KEYS = agent_signals.SIGNALS
FABRIC_STATES = frozenset(agent_signals.FABRIC_STATES.values())
IMEX_STATES = frozenset({"ready", "not_ready", "unavailable", "unsupported"})
NVLINK_COUNTERS = tuple(name for name, _ in agent_signals.NVLINK_COUNTERS)

# Ring sizes: a sample a minute for an hour, one an hour for two days.
MINUTE, HOUR = 60.0, 3600.0
MINUTES_KEPT, HOURS_KEPT = 60, 48


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _counts(where: str, obj: Any, keys: tuple[str, ...], flags: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Errors of an object of counters (``keys``, each optional) and booleans."""
    if not isinstance(obj, dict):
        return {where: ["must be an object"]}
    errors: dict[str, list[str]] = {}
    for key in keys:
        if key in obj and not _count(obj[key]):
            errors[f"{where}.{key}"] = [f"must be a whole number from 0 to {MAX_COUNT}"]
    for key in flags:
        if key in obj and not isinstance(obj[key], bool):
            errors[f"{where}.{key}"] = ["must be true or false"]
    return errors


def _text(value: Any, allowed: frozenset[str] | None = None) -> str | None:
    if not isinstance(value, str) or len(value) > MAX_TEXT or "\x00" in value:
        return f"must be a string of at most {MAX_TEXT} characters"
    if allowed is not None and value not in allowed:
        return f"unknown value {value!r}; one of {', '.join(sorted(allowed))}"
    return None


def _nvlink_errors(obj: Any) -> dict[str, list[str]]:
    if not isinstance(obj, dict):
        return {"nvlink": ["must be an object"]}
    source = obj.get("source")
    if source == "fields":
        return _counts("nvlink", obj, ("link_count", *NVLINK_COUNTERS))
    if source != "links":
        return {"nvlink.source": ["must be 'links' (per-link counters) or 'fields' (NVML field values)"]}
    links = obj.get("links")
    if not isinstance(links, list) or len(links) > MAX_LINKS:
        return {"nvlink.links": [f"must be a list of at most {MAX_LINKS} links"]}
    errors: dict[str, list[str]] = {}
    for i, link in enumerate(links):
        where = f"nvlink.links[{i}]"
        errors.update(_counts(where, link, NVLINK_COUNTERS, ("active",)))
        if isinstance(link, dict) and not (_count(link.get("link")) and link["link"] < MAX_LINKS):
            errors[f"{where}.link"] = [f"required: the link number, 0 to {MAX_LINKS - 1}"]
    return errors


def _fabric_errors(obj: Any) -> dict[str, list[str]]:
    """The fabric's fields; null where NVML gives none (a cluster UUID of zeros,
    no health mask from the older call)."""
    if not isinstance(obj, dict):
        return {"fabric": ["must be an object"]}
    given = {k: v for k, v in obj.items() if v is not None}
    errors = _counts("fabric", given, ("clique_id", "health_mask"))
    for key, allowed in (("cluster_uuid", None), ("state", FABRIC_STATES), ("status", None)):
        if key in given and (problem := _text(given[key], allowed)):
            errors[f"fabric.{key}"] = [problem + " or null"]
    return errors


def signal_errors(signals: Any, unsupported: Any) -> dict[str, list[str]]:
    """Problems with a GPU entry's ``signals`` and ``unsupported``, keyed by the
    field's path below the entry. Keys this server does not know are ignored
    (a newer agent may send more)."""
    errors: dict[str, list[str]] = {}
    if not isinstance(unsupported, list) or len(unsupported) > len(SIGNAL_KEYS) * 2:
        errors["unsupported"] = [f"must be a list of signal names ({', '.join(SIGNAL_KEYS)})"]
    elif not all(isinstance(u, str) and len(u) <= MAX_TEXT for u in unsupported):
        errors["unsupported"] = ["must hold signal names (strings)"]
    if not isinstance(signals, dict):
        return {**errors, "signals": ["must be an object"]}
    power = signals.get("power_w")
    if power is not None and (
        isinstance(power, bool) or not isinstance(power, int | float) or not math.isfinite(power)
    ):
        errors["signals.power_w"] = ["must be a number of watts"]
    elif power is not None and not 0 <= power <= 100_000:
        errors["signals.power_w"] = ["must be from 0 to 100000 watts"]
    reasons = signals.get("clock_event_reasons")
    if reasons is not None and (
        not isinstance(reasons, list)
        or len(reasons) > len(CLOCK_EVENT_REASONS)
        or not all(isinstance(r, str) and r in CLOCK_EVENT_REASONS for r in reasons)
    ):
        errors["signals.clock_event_reasons"] = [
            "must be a list of reason names: " + ", ".join(sorted(CLOCK_EVENT_REASONS))
        ]
    checks = {
        "ecc": lambda o: _counts(
            "ecc",
            o,
            ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected"),
        ),
        "remapped_rows": lambda o: _counts(
            "remapped_rows", o, ("correctable", "uncorrectable"), ("pending", "failure")
        ),
        "retired_pages": lambda o: _counts("retired_pages", o, ("single_bit", "double_bit"), ("pending",)),
        "nvlink": _nvlink_errors,
        "fabric": _fabric_errors,
    }
    for key, check in checks.items():
        if key in signals:
            errors.update({f"signals.{k}": v for k, v in check(signals[key]).items()})
    if "pcie_replay_count" in signals and not _count(signals["pcie_replay_count"]):
        errors["signals.pcie_replay_count"] = [f"must be a whole number from 0 to {MAX_COUNT}"]
    return errors


def imex_errors(imex: Any) -> dict[str, list[str]]:
    if not isinstance(imex, dict):
        return {"imex": ["must be an object with status and detail"]}
    errors = {}
    if problem := _text(imex.get("status"), IMEX_STATES):
        errors["imex.status"] = [problem]
    detail = imex.get("detail", "")
    if not isinstance(detail, str) or len(detail) > 500 or "\x00" in detail:
        errors["imex.detail"] = ["must be a string of at most 500 characters"]
    return errors


def counters_of(signals: dict[str, Any]) -> dict[str, int]:
    """The cumulative counters in ``signals``, by flat name (``ecc.volatile_corrected``,
    ``nvlink.crc_flit`` summed over links, ...)."""
    out: dict[str, int] = {}
    for group in ("ecc", "remapped_rows", "retired_pages"):
        for key, value in (signals.get(group) or {}).items():
            if _count(value):
                out[f"{group}.{key}"] = value
    if _count(signals.get("pcie_replay_count")):
        out["pcie_replay_count"] = signals["pcie_replay_count"]
    nvlink = signals.get("nvlink") or {}
    parts = nvlink.get("links", []) if nvlink.get("source") == "links" else [nvlink]
    for key in NVLINK_COUNTERS:
        values = [p[key] for p in parts if isinstance(p, dict) and _count(p.get(key))]
        if values:
            out[f"nvlink.{key}"] = sum(values)
    return out


def advance(state: dict[str, Any], values: dict[str, int], at: float) -> bool:
    """Fold one heartbeat's counter ``values`` (taken at ``at``, epoch seconds)
    into ``state`` (``counters``: name -> {last, total, resets}; ``minutes``
    and ``hours``: rings of [at, {name: total}, temperature, power]). A value
    below the last is a reset: the counter started again from zero. Returns
    whether any counter rose or was reset (the state must then be stored)."""
    counters = state.setdefault("counters", {})
    rose = False
    for name, value in values.items():
        c = counters.get(name)
        if c is None:
            counters[name] = {"last": value, "total": 0, "resets": 0}
            continue
        if value < c["last"]:
            c["resets"] += 1
            step = value
            rose = True
        else:
            step = value - c["last"]
        c["total"] += step
        c["last"] = value
        rose = rose or step > 0
    return rose


def sample(state: dict[str, Any], at: float, temperature: float | None, power: float | None) -> None:
    """Add a sample of the totals to the rings when a minute (an hour) has gone by."""
    totals = {name: c["total"] for name, c in state.get("counters", {}).items()}
    for ring, every, kept in (("minutes", MINUTE, MINUTES_KEPT), ("hours", HOUR, HOURS_KEPT)):
        samples = state.setdefault(ring, [])
        if not samples or at - samples[-1][0] >= every:
            samples.append([at, totals, temperature, power])
            del samples[:-kept]


def rate_per_hour(state: dict[str, Any], name: str, window_s: float, now: float) -> float | None:
    """How fast counter ``name`` rose over the last ``window_s`` seconds, per hour
    (None: not enough history yet). Reads the minute ring for windows within
    an hour, the hour ring beyond."""
    return rate_of(rise_within(state, name, window_s, now), window_s)


def rate_of(seen: tuple[float, float] | None, window_s: float) -> float | None:
    """The rate per hour of a rise over seconds seen (:func:`rise_within`), or
    None with less than half the window seen."""
    if seen is None or seen[1] < window_s / 2:
        return None
    return seen[0] * 3600.0 / seen[1]


def rise_within(state: dict[str, Any], name: str, window_s: float, now: float) -> tuple[float, float] | None:
    """How much counter ``name`` rose within the last ``window_s`` seconds, and
    over how many seconds of history (the oldest sample in the window to now);
    None without a sample there."""
    c = state.get("counters", {}).get(name)
    if c is None:
        return None
    ring = state.get("minutes" if window_s <= HOUR else "hours", [])
    start = next((s for s in ring if s[0] >= now - window_s - MINUTE), None)
    if start is None or name not in start[1] or now <= start[0]:
        return None
    return c["total"] - start[1][name], now - start[0]
