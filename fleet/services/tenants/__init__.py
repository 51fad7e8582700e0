"""Tenants sharing the fleet: their quotas and fair-share settings (``quotas``),
and what each holds against them (``usage``)."""
