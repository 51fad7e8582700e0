"""The health rules a fleet starts with (operators change them: /api/health-rules/).

Starting points, not tuned to a fleet: NVIDIA's GPU memory error management
guide (a row-remap failure means the GPU needs service; a pending remap or an
uncorrectable error needs a GPU reset, so drain; retired pages on pre-Ampere
GPUs likewise), rising corrected-error, PCIe replay and NVLink error rates as
precursors, and hardware slowdowns as suspect."""

from django.db import migrations

H = 3600
DEFAULTS = [
    ("remap-failure", "remapped_rows.failure", "set", 0, H, "fail",
     "A row remap failed: the GPU's memory cannot be repaired in place."),
    ("uncorrectable-ecc", "ecc.volatile_uncorrected", "above", 0, H, "drain",
     "An uncorrectable ECC error since the driver loaded: reset the GPU once its job ends."),
    ("remap-pending", "remapped_rows.pending", "set", 0, H, "drain",
     "A row remap waits for a GPU reset."),
    ("retired-pages-pending", "retired_pages.pending", "set", 0, H, "drain",
     "A page retirement waits for a GPU reset (GPUs without row remapping)."),
    ("corrected-ecc-rising", "ecc.volatile_corrected", "rate_above", 100, H, "drain",
     "Corrected ECC errors rising fast: memory going bad."),
    ("pcie-replays-rising", "pcie_replay_count", "rate_above", 100, H, "drain",
     "PCIe replays rising: the link or riser is failing."),
    ("nvlink-crc-rising", "nvlink.crc_flit", "rate_above", 1000, H, "drain",
     "NVLink CRC flit errors rising: a link or the switch tray is failing."),
    ("nvlink-recovery-rising", "nvlink.recovery", "rate_above", 10, H, "drain",
     "NVLink recoveries rising."),
    ("hw-slowdown", "clock_event_reasons.hw_slowdown", "set", 0, H, "suspect",
     "The GPU is held back by hardware slowdown."),
    ("hw-thermal-slowdown", "clock_event_reasons.hw_thermal_slowdown", "set", 0, H, "suspect",
     "Hardware thermal slowdown."),
    ("hw-power-brake", "clock_event_reasons.hw_power_brake_slowdown", "set", 0, H, "suspect",
     "Power brake slowdown (the rack's power shelf asked for it)."),
    ("fabric-health", "fabric.health_mask", "above", 0, H, "suspect",
     "The GPU's NVLink fabric reports a health problem."),
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
    dependencies = [("fleet", "0014_health_rules")]
    operations = [migrations.RunPython(add, remove)]
