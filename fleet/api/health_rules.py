"""API for the health rules that turn a GPU's signals into verdicts: every
reader sees them; operators add, change and remove them (audited)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from fleet.api.serializers import KnownFieldsOnly
from fleet.choices import RuleTest, Verdict
from fleet.gpu_verdicts import TESTS_FOR, WINDOW_RANGE_S
from fleet.models import HealthRule
from fleet.services import health_rules as rule_services


class HealthRuleSerializer(KnownFieldsOnly):
    name = serializers.SlugField(max_length=100, help_text="Its name (letters, digits, '-' and '_').")
    signal = serializers.ChoiceField(
        choices=list(TESTS_FOR), help_text="The signal it reads (README: 'Health rules')."
    )
    test = serializers.ChoiceField(
        choices=RuleTest.choices,
        help_text="rate_above: rise per hour over window_s, across counter resets; above: the value now; "
        "set: a flag or clock-event reason is set.",
    )
    threshold = serializers.FloatField(min_value=0, max_value=1e15, default=0.0)
    window_s = serializers.IntegerField(
        min_value=WINDOW_RANGE_S[0], max_value=WINDOW_RANGE_S[1], default=3600
    )
    verdict = serializers.ChoiceField(
        choices=Verdict.choices,
        help_text="fail: the GPU fails now; drain: the node takes no new work and is drained when its jobs "
        "end; suspect: the GPU is marked degraded with the reason.",
    )
    enabled = serializers.BooleanField(default=True)
    description = serializers.CharField(max_length=500, allow_blank=True, default="")


class HealthRuleViewSet(viewsets.ViewSet):
    """Health rules: which signal, tested how, over which window, gives which verdict."""

    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"

    @staticmethod
    def _data(rule: HealthRule) -> dict:
        return HealthRuleSerializer(rule).data

    def _get(self, name: str) -> HealthRule:
        rule = HealthRule.objects.filter(name=name).first()
        if rule is None:
            raise NotFound(f"no health rule {name!r}")
        return rule

    @extend_schema(responses=HealthRuleSerializer(many=True))
    def list(self, request):
        return Response([self._data(r) for r in HealthRule.objects.order_by("name")])

    @extend_schema(responses=HealthRuleSerializer)
    def retrieve(self, request, name=None):
        return Response(self._data(self._get(name)))

    @extend_schema(request=HealthRuleSerializer, responses={201: HealthRuleSerializer})
    def create(self, request):
        """Add a rule (operators)."""
        form = HealthRuleSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        values = dict(form.validated_data)
        rule = rule_services.create_rule(request.user, values.pop("name"), values)
        return Response(self._data(rule), status=status.HTTP_201_CREATED)

    @extend_schema(request=HealthRuleSerializer(partial=True), responses=HealthRuleSerializer)
    def partial_update(self, request, name=None):
        """Change a rule's signal, test, threshold, window, verdict or description,
        or turn it off (operators)."""
        self._get(name)
        form = HealthRuleSerializer(data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        changes = {k: v for k, v in form.validated_data.items() if k != "name"}
        return Response(self._data(rule_services.update_rule(request.user, name, changes)))

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        """Remove a rule (operators)."""
        self._get(name)
        rule_services.delete_rule(request.user, name)
        return Response(status=status.HTTP_204_NO_CONTENT)
