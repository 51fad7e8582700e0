"""API for tenants sharing the fleet: their quotas, usage and fair share
(any reader), and quota and weight changes (operators)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from fleet.api.serializers import KnownFieldsOnly
from fleet.models import Tenant
from fleet.services.read.tenants import tenant_figures
from fleet.services.tenants import quotas as quota_services

MAX_GPUS = 10_000_000  # a bound for the parser; the service bounds each figure by the fleet
MAX_RACKS = 10_000  # the same for a list of racks (the service checks each exists)


class QuotaSerializer(KnownFieldsOnly):
    gpus_per_node = serializers.IntegerField(
        min_value=1, max_value=64, help_text="The node shape: 4 for NVL72 and NVL36 racks, 8 for HGX nodes."
    )
    nominal_gpus = serializers.IntegerField(
        min_value=0, max_value=MAX_GPUS, help_text="Guaranteed GPUs of this shape (spare nodes not counted)."
    )
    borrowing_limit_gpus = serializers.IntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        required=False,
        allow_null=True,
        help_text="GPUs it may borrow beyond its nominal quota from its cohort; null: no limit.",
    )
    lending_limit_gpus = serializers.IntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        required=False,
        allow_null=True,
        help_text="GPUs of its nominal quota others may borrow while idle; null: all of it.",
    )


class QuotaFiguresSerializer(QuotaSerializer):
    in_use_gpus = serializers.IntegerField()
    borrowed_gpus = serializers.IntegerField(help_text="What it holds beyond its nominal quota.")
    lent_gpus = serializers.IntegerField(help_text="Its idle lendable quota that other tenants use now.")
    pending_gpus = serializers.IntegerField(help_text="GPUs its pending jobs charged to this shape ask for.")
    fair_share_gpus = serializers.IntegerField(
        help_text="Its fair share of the cohort's GPUs now: its nominal quota up to its demand (held plus "
        "pending), then what is left by weight among those that want more. A job its quota holds back "
        "reclaims from tenants above both their quota and their fair share while its tenant stays "
        "within this."
    )
    cohort_capacity_gpus = serializers.IntegerField()


class TenantSerializer(serializers.Serializer):
    name = serializers.CharField()
    cohort = serializers.CharField(help_text="Tenants of a cohort lend each other their unused quota.")
    weight = serializers.FloatField(help_text="Its weight in the fair share of what is left over.")
    fair_share = serializers.FloatField(help_text="Its weight over all tenants' weights.")
    decayed_usage_gpu_hours = serializers.FloatField(
        help_text="GPU-hours used, halved per RACKWISE_FAIR_SHARE_HALF_LIFE_H gone by."
    )
    pending_gpus = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()
    running_jobs = serializers.IntegerField()
    quotas = QuotaFiguresSerializer(many=True)
    reserved_racks = serializers.ListField(
        child=serializers.CharField(), help_text="Racks (NVLink domains) reserved for it, by name."
    )


class QuotasSerializer(KnownFieldsOnly):
    quotas = QuotaSerializer(
        many=True, help_text="One per node shape; an empty list removes the tenant's quotas."
    )
    reserved_racks = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=MAX_RACKS,
        help_text="Racks reserved for the tenant, by name (omitted: unchanged; empty: none). Its work goes "
        "there first and others' only while they are idle; their GPUs outside spare nodes count towards "
        "its nominal quota of their shape.",
    )


class ShareSerializer(KnownFieldsOnly):
    weight = serializers.FloatField(min_value=0.01, max_value=1000.0, required=False)
    cohort = serializers.SlugField(max_length=100, required=False)


class TenantViewSet(viewsets.ViewSet):
    """Tenants: quota, usage, borrowing, lending, pending demand and fair share."""

    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"

    def _one(self, name: str) -> dict:
        found = tenant_figures(name)
        if not found:
            raise NotFound(f"no tenant {name!r}")
        return found[0]

    @extend_schema(responses=TenantSerializer(many=True))
    def list(self, request):
        return Response(tenant_figures())

    @extend_schema(responses=TenantSerializer)
    def retrieve(self, request, name=None):
        return Response(self._one(name))

    @extend_schema(request=ShareSerializer, responses=TenantSerializer)
    def partial_update(self, request, name=None):
        """Change the tenant's fair-share weight or cohort (operators)."""
        form = ShareSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        quota_services.set_share(request.user, name, **form.validated_data)
        return Response(self._one(name))

    @extend_schema(request=QuotasSerializer, responses=TenantSerializer)
    @action(detail=True, methods=["put"])
    def quotas(self, request, name=None):
        """Replace the tenant's quotas (operators). Every figure is bounded by
        the GPUs the fleet has of that shape outside spare nodes."""
        if not Tenant.objects.filter(name=name).exists():
            raise NotFound(f"no tenant {name!r}")
        form = QuotasSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        quota_services.set_quotas(
            request.user, name, form.validated_data["quotas"], form.validated_data.get("reserved_racks")
        )
        return Response(self._one(name))
