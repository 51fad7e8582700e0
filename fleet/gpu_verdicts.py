"""Health rules applied to a GPU's reading: which signal, tested how, over which
window, gives which verdict (``HealthRule`` rows, edited by operators).

Signals, by name:

* counters (:func:`fleet.gpu_signals.counters_of`: ``ecc.*``,
  ``remapped_rows.correctable|uncorrectable``, ``retired_pages.single_bit|double_bit``,
  ``pcie_replay_count``, ``nvlink.replay|recovery|crc_flit|crc_data``): ``rate_above``
  (rise per hour over the window, across resets) or ``above`` (the value NVML
  gives now);
* flags (``remapped_rows.pending|failure``, ``retired_pages.pending``,
  ``clock_event_reasons.<reason>``): ``set``;
* numbers (``temperature_c``, ``power_w``, ``fabric.health_mask``): ``above``.

The worst verdict wins (fail, then drain, then suspect), and says which reading
caused it. Pure: the caller reads the rules and stores the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet import gpu_signals as signals
from fleet.choices import RuleTest, Verdict

COUNTERS = (
    *(
        f"ecc.{k}"
        for k in (
            "volatile_corrected",
            "volatile_uncorrected",
            "aggregate_corrected",
            "aggregate_uncorrected",
        )
    ),
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "retired_pages.single_bit",
    "retired_pages.double_bit",
    "pcie_replay_count",
    *(f"nvlink.{k}" for k in signals.NVLINK_COUNTERS),
)
FLAGS = (
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
    *(f"clock_event_reasons.{r}" for r in sorted(signals.CLOCK_EVENT_REASONS)),
)
NUMBERS = ("temperature_c", "power_w", "fabric.health_mask")
TESTS_FOR = {
    **dict.fromkeys(COUNTERS, (RuleTest.RATE_ABOVE, RuleTest.ABOVE)),
    **dict.fromkeys(FLAGS, (RuleTest.SET,)),
    **dict.fromkeys(NUMBERS, (RuleTest.ABOVE,)),
}
SEVERITY: dict[str, int] = {Verdict.FAIL: 3, Verdict.DRAIN: 2, Verdict.SUSPECT: 1}
# Rate windows a rule may use: the rings keep an hour of minutes and two days of hours.
WINDOW_RANGE_S = (120, 2 * 86400)


@dataclass(frozen=True)
class Rule:
    name: str
    signal: str
    test: str
    threshold: float
    window_s: int
    verdict: str


def _value(name: str, sig: dict[str, Any], temperature: float | None) -> Any:
    if name == "temperature_c":
        return temperature
    if name.startswith("clock_event_reasons."):
        reasons = sig.get("clock_event_reasons")
        return None if reasons is None else name.partition(".")[2] in reasons
    group, _, key = name.partition(".")
    if not key:
        return sig.get(group)
    if group == "nvlink":
        return signals.counters_of(sig).get(name)
    return (sig.get(group) or {}).get(key)


def _window(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds // 60} min"


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _fires(
    rule: Rule, sig: dict[str, Any], state: dict[str, Any], temperature: float | None, now: float
) -> str:
    """Why ``rule`` fires on this reading, or ''."""
    if rule.test == RuleTest.RATE_ABOVE:
        seen = signals.rise_within(state, rule.signal, rule.window_s, now)
        rate = signals.rate_of(seen, rule.window_s)
        if rate is not None and rate > rule.threshold:
            return (
                f"{rule.signal} rose {rate:.4g}/h over the last {_window(rule.window_s)} "
                f"(rule {rule.name}: above {rule.threshold:g}/h)"
            )
        # Less than half the window seen (an agent just started): a rise that
        # alone already exceeds the threshold over the whole window fires now,
        # whatever the rest of the window brings.
        if rate is None and seen is not None and seen[0] * 3600.0 / rule.window_s > rule.threshold:
            return (
                f"{rule.signal} rose {seen[0]:.4g} in {_span(seen[1])}, above "
                f"{rule.threshold:g}/h over any {_window(rule.window_s)} (rule {rule.name})"
            )
        return ""
    value = _value(rule.signal, sig, temperature)
    if rule.test == RuleTest.SET:
        return f"{rule.signal} is set (rule {rule.name})" if value is True else ""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > rule.threshold:
        return f"{rule.signal} is {value:g} (rule {rule.name}: above {rule.threshold:g})"
    return ""


def evaluate(
    rules: list[Rule], sig: dict[str, Any], state: dict[str, Any], temperature: float | None, now: float
) -> tuple[str, str]:
    """(the worst verdict, the reading that caused it) of ``rules`` on one GPU's
    reading; ('', '') when none fires."""
    worst, why = "", ""
    for rule in rules:
        if SEVERITY[rule.verdict] <= SEVERITY.get(worst, 0):
            continue
        reason = _fires(rule, sig, state, temperature, now)
        if reason:
            worst, why = rule.verdict, reason
    return worst, why


def rule_errors(signal: str, test: str, threshold: float, window_s: int) -> dict[str, list[str]]:
    """Why a rule cannot be evaluated, by field."""
    if signal not in TESTS_FOR:
        return {"signal": [f"unknown signal {signal!r}; one of: {', '.join(TESTS_FOR)}"]}
    allowed = TESTS_FOR[signal]
    errors: dict[str, list[str]] = {}
    if test not in allowed:
        errors["test"] = [f"{signal} can be tested with {' or '.join(allowed)}"]
    if test == RuleTest.RATE_ABOVE and not WINDOW_RANGE_S[0] <= window_s <= WINDOW_RANGE_S[1]:
        errors["window_s"] = [f"a window from {WINDOW_RANGE_S[0]} s to {WINDOW_RANGE_S[1]} s (two days)"]
    if threshold < 0:
        errors["threshold"] = ["0 or more"]
    return errors
