"""Health signals in the console (the rack page's node health):
``{% sparkline samples 1 "hottest GPU" "°C" %}`` draws a node's last hour
(fleet.sparkline), ``{{ name|signal_label }}`` names a counter or flag in
words, ``{{ rate|per_hour }}`` writes a rise per hour."""

from __future__ import annotations

from django import template
from django.utils.safestring import mark_safe

from fleet import sparkline as drawing

register = template.Library()

LABELS = {
    "ecc.volatile_corrected": "ECC corrected",
    "ecc.volatile_uncorrected": "ECC uncorrected",
    "ecc.aggregate_corrected": "ECC corrected (lifetime)",
    "ecc.aggregate_uncorrected": "ECC uncorrected (lifetime)",
    "remapped_rows.correctable": "rows remapped (correctable)",
    "remapped_rows.uncorrectable": "rows remapped (uncorrectable)",
    "remapped_rows.pending": "row remap pending",
    "remapped_rows.failure": "row remap failed",
    "retired_pages.single_bit": "pages retired (single bit)",
    "retired_pages.double_bit": "pages retired (double bit)",
    "retired_pages.pending": "page retirement pending",
    "pcie_replay_count": "PCIe replays",
    "nvlink.replay": "NVLink replays",
    "nvlink.recovery": "NVLink recoveries",
    "nvlink.crc_flit": "NVLink CRC flit errors",
    "nvlink.crc_data": "NVLink CRC data errors",
}


@register.simple_tag
def sparkline(samples, column: int, label: str, unit: str) -> str:
    # The markup is built from numbers and escaped text only (fleet.sparkline).
    return mark_safe(drawing.sparkline(samples, column, label=label, unit=unit))


@register.filter
def signal_label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


@register.filter
def per_hour(rate: float) -> str:
    if rate >= 100:
        return f"+{rate:,.0f}/h"
    return f"+{rate:.3g}/h"


@register.filter
def gpu_list(indices: list[int]) -> str:
    """'GPU 2', 'GPUs 0, 1, 3'."""
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)
