"""Suspect rules for error rates that climb below the drain thresholds of 0015:
such a GPU keeps its work, but gangs and recovery's swaps take other nodes first
(placement: ``Rack.at_risk``). Starting points, a fifth of the drain rates."""

from django.db import migrations

H = 3600
DEFAULTS = [
    ("corrected-ecc-climbing", "ecc.volatile_corrected", "rate_above", 20, H, "suspect",
     "Corrected ECC errors climbing: keep long gangs off it."),
    ("pcie-replays-climbing", "pcie_replay_count", "rate_above", 20, H, "suspect",
     "PCIe replays climbing: keep long gangs off it."),
    ("nvlink-crc-climbing", "nvlink.crc_flit", "rate_above", 200, H, "suspect",
     "NVLink CRC flit errors climbing: keep long gangs off it."),
]


def add(apps, schema_editor):
    HealthRule = apps.get_model("fleet", "HealthRule")
    for name, signal, test, threshold, window_s, verdict, description in DEFAULTS:
        HealthRule.objects.get_or_create(
            name=name,
            defaults=dict(
                signal=signal, test=test, threshold=threshold, window_s=window_s, verdict=verdict,
                description=description,
            ),
        )


def remove(apps, schema_editor):
    apps.get_model("fleet", "HealthRule").objects.filter(name__in=[d[0] for d in DEFAULTS]).delete()


class Migration(migrations.Migration):
    dependencies = [("fleet", "0017_evacuation")]
    operations = [migrations.RunPython(add, remove)]
