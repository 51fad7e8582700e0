"""Server-rendered pages. Every page needs a login (middleware) and a role."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.views.generic import TemplateView

from fleet.choices import Role
from fleet.models import Rack
from fleet.permissions import has_role
from fleet.services.summary import fleet_summary, rack_summaries


class RoleRequiredMixin:
    """Logged-in users without a Rackwise role (outsiders) are refused."""

    minimum_role = Role.VIEWER

    def dispatch(self, request, *args, **kwargs):
        if not has_role(request.user, self.minimum_role):
            raise PermissionDenied("You need a Rackwise role; ask an operator to add you.")
        return super().dispatch(request, *args, **kwargs)


class FleetView(RoleRequiredMixin, TemplateView):
    template_name = "fleet/fleet.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        racks = list(Rack.objects.all())
        summaries = rack_summaries()
        context["summary"] = fleet_summary()
        context["racks"] = [(rack, summaries[rack.id]) for rack in racks]
        return context
