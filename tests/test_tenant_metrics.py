"""Per-tenant series in /metrics: the same figures as the Tenants page and
/api/tenants/ (one read model, tenant_figures)."""

from __future__ import annotations

import pytest

from fleet.services.read.tenants import tenant_figures
from fleet.services.tenants.quotas import set_quotas, set_share
from tests.test_metrics import one, scrape

pytestmark = pytest.mark.django_db


def test_each_tenants_quota_usage_pending_share_and_usage_are_served(fragmented, operator, other_submitter):
    # llm holds 32 GPUs (jobs a and b) on a nominal 16; the two quotas cover the
    # cohort's 128 GPUs, so the 16 it borrows are vision's idle quota, lent.
    set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 16}])
    set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 112, "lending_limit_gpus": 48}])
    set_share(operator, "llm", weight=3)

    samples = scrape()

    def gpus(tenant: str, kind: str) -> float:
        return one(samples, "rackwise_tenant_gpus", tenant=tenant, shape="4", kind=kind)

    kinds = ("nominal", "in_use", "borrowed", "lent", "fair_share")
    # llm's fair share: all it asks for (32 held, 64 pending), as vision asks for nothing.
    assert [gpus("llm", k) for k in kinds] == [16, 32, 16, 0, 96]
    assert [gpus("vision", k) for k in kinds] == [112, 0, 0, 16, 0]
    assert one(samples, "rackwise_tenant_pending_gpus", tenant="llm", shape="4") == 64  # job c's 16 nodes
    assert one(samples, "rackwise_tenant_pending_gpus", tenant="vision", shape="4") == 0
    assert one(samples, "rackwise_tenant_fair_share", tenant="llm") == pytest.approx(0.75)
    assert one(samples, "rackwise_tenant_fair_share", tenant="vision") == pytest.approx(0.25)
    assert one(samples, "rackwise_tenant_decayed_gpu_hours", tenant="vision") == 0
    assert one(samples, "rackwise_tenant_decayed_gpu_hours", tenant="llm") >= 0

    # The page's and the API's figures, sample for sample.
    for t in tenant_figures():
        assert one(samples, "rackwise_tenant_fair_share", tenant=t["name"]) == pytest.approx(t["fair_share"])
        for q in t["quotas"]:
            for kind in kinds:
                labels = {"tenant": t["name"], "shape": str(q["gpus_per_node"]), "kind": kind}
                assert one(samples, "rackwise_tenant_gpus", **labels) == q[f"{kind}_gpus"]
            shape = str(q["gpus_per_node"])
            assert (
                one(samples, "rackwise_tenant_pending_gpus", tenant=t["name"], shape=shape)
                == q["pending_gpus"]
            )


def test_a_tenant_without_quota_or_usage_has_no_gpu_series_but_its_share(fleet, other_submitter):
    samples = scrape()
    assert not any(dict(k).get("tenant") == "vision" for k in samples.get("rackwise_tenant_gpus", {}))
    assert one(samples, "rackwise_tenant_fair_share", tenant="vision") == 1.0
