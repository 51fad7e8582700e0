from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from fleet.api import views

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("racks", views.RackViewSet, basename="rack")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("audit", views.AuditEventViewSet, basename="audit")

urlpatterns = [
    path("", include(router.urls)),
    path("fleet/summary/", views.FleetSummaryView.as_view(), name="fleet-summary"),
    path("me/", views.MeView.as_view(), name="me"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]
