"""API for event webhooks (operators only): register endpoints, see their
delivery history, send a test, redeliver. The signing secret is returned on
create and on rotation only."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from fleet.api.serializers import KnownFieldsOnly
from fleet.choices import WebhookEvent
from fleet.models import WebhookDelivery, WebhookEndpoint
from fleet.permissions import IsOperator
from fleet.services import webhooks as webhook_services


class WebhookEndpointSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "event_types",
            "active",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class WebhookEndpointWithSecretSerializer(WebhookEndpointSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown only now: keep it to verify signatures.")

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookEndpointInputSerializer(KnownFieldsOnly):
    # Plain fields: the URL scheme and the event types are checked by the
    # service, which names the valid choices in its 400.
    url = serializers.CharField(max_length=500, help_text="http:// or https:// URL that receives the POSTs.")
    event_types = serializers.ListField(
        child=serializers.CharField(), help_text=f"Any of: {', '.join(WebhookEvent.values)}."
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    active = serializers.BooleanField(required=False, default=True)


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "endpoint",
            "event_type",
            "event_id",
            "state",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "last_duration_ms",
            "created_at",
            "delivered_at",
            "payload",
        ]
        read_only_fields = fields


# A body the API accepts, in the schema (a public address literal: no DNS lookup).
WEBHOOK_EXAMPLES = [
    OpenApiExample(
        "job and node events",
        value={"url": "https://93.184.215.14/rackwise", "event_types": ["job.placed", "node.failed"]},
        request_only=True,
    )
]


class WebhookEndpointViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Webhook endpoints. Every event they subscribe to is POSTed to them, signed
    with ``X-Rackwise-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "t.body">``."""

    queryset = WebhookEndpoint.objects.select_related("created_by")
    serializer_class = WebhookEndpointSerializer
    permission_classes = [IsOperator]

    @extend_schema(
        request=WebhookEndpointInputSerializer,
        responses={201: WebhookEndpointWithSecretSerializer},
        examples=WEBHOOK_EXAMPLES,
    )
    def create(self, request, *args, **kwargs):
        form = WebhookEndpointInputSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        endpoint = webhook_services.create_endpoint(request.user, **form.validated_data)
        return Response(WebhookEndpointWithSecretSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookEndpointInputSerializer, responses=WebhookEndpointSerializer)
    def update(self, request, *args, **kwargs):
        endpoint = self.get_object()
        # Partial: only the fields given (DRF leaves defaults out of a partial form).
        form = WebhookEndpointInputSerializer(data=request.data, partial=kwargs.get("partial", False))
        form.is_valid(raise_exception=True)
        endpoint = webhook_services.update_endpoint(request.user, endpoint.pk, **form.validated_data)
        return Response(WebhookEndpointSerializer(endpoint).data)

    @extend_schema(request=WebhookEndpointInputSerializer(partial=True), responses=WebhookEndpointSerializer)
    def partial_update(self, request, *args, **kwargs):
        return self.update(request, *args, partial=True, **kwargs)

    def perform_destroy(self, instance):
        webhook_services.delete_endpoint(self.request.user, instance.pk)

    @extend_schema(request=None, responses=WebhookEndpointWithSecretSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        """A new signing secret, returned once; the old one stops working now."""
        endpoint = webhook_services.rotate_secret(request.user, self.get_object().pk)
        return Response(WebhookEndpointWithSecretSerializer(endpoint).data)

    @extend_schema(responses=WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The endpoint's deliveries, newest first (paginated: ``limit``, ``offset``)."""
        endpoint = self.get_object()
        page = self.paginate_queryset(endpoint.deliveries.order_by("-created_at", "-id"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        """Send a ``ping`` event to this endpoint now."""
        delivery = webhook_services.send_test(request.user, self.get_object().pk)
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class WebhookDeliveryViewSet(viewsets.ReadOnlyModelViewSet):
    """Every endpoint's deliveries, newest first; redeliver one."""

    queryset = WebhookDelivery.objects.all()
    serializer_class = WebhookDeliverySerializer
    permission_classes = [IsOperator]
    filterset_fields = ["endpoint", "state", "event_type"]

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def redeliver(self, request, pk=None):
        """Send a finished delivery's event again, as a new delivery."""
        delivery = webhook_services.redeliver(request.user, self.get_object().pk)
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)
