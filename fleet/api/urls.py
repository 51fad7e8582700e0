from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from fleet.api import actions, agent, console, errors, health_rules, tenants, views, webhooks

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("racks", views.RackViewSet, basename="rack")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("audit", views.AuditEventViewSet, basename="audit")
router.register("actions", actions.ActionViewSet, basename="action")
router.register("tenants", tenants.TenantViewSet, basename="tenant")
router.register("health-rules", health_rules.HealthRuleViewSet, basename="health-rule")
router.register("webhooks", webhooks.WebhookEndpointViewSet, basename="webhook")
router.register("webhook-deliveries", webhooks.WebhookDeliveryViewSet, basename="webhook-delivery")

urlpatterns = [
    path("", include(router.urls)),
    path("fleet/summary/", views.FleetSummaryView.as_view(), name="fleet-summary"),
    path("fleet/fragmentation/", views.FragmentationView.as_view(), name="fleet-fragmentation"),
    path("console/racks/", console.ConsoleRacksView.as_view(), name="console-racks"),
    path("console/samples/", console.FleetSamplesView.as_view(), name="console-samples"),
    path("approval-policy/", actions.ApprovalPolicyView.as_view(), name="approval-policy"),
    path("step-kinds/", actions.StepKindsView.as_view(), name="step-kinds"),
    path("actions/<int:pk>/callback/", actions.ActionCallbackView.as_view(), name="action-callback"),
    path("nodes/<int:pk>/heartbeat/", agent.NodeHeartbeatView.as_view(), name="node-heartbeat"),
    path("nodes/<int:pk>/agent-token/", agent.NodeAgentTokenView.as_view(), name="node-agent-token"),
    path("attention/", views.AttentionView.as_view(), name="attention"),
    path("me/", views.MeView.as_view(), name="me"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    # Last: any other path under /api/ answers a JSON 404, with DEBUG on too.
    re_path(r"^", errors.unknown_api_path),
]
