"""Django admin for every model. State changes go through services (admin
actions); inventory edits are audited; jobs, allocations and the audit log are
read-only here."""

from __future__ import annotations

from django.contrib import admin, messages

from fleet.models import (
    GPU,
    Action,
    AgentToken,
    Allocation,
    ApprovalPolicy,
    AuditEvent,
    Job,
    Node,
    Rack,
    Tenant,
    WebhookDelivery,
    WebhookEndpoint,
)
from fleet.services import audit
from fleet.services import webhooks as webhook_services
from fleet.services.actions import propose as action_services
from fleet.services.errors import ServiceError
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.services.racks import bump_versions


def _run_service(modeladmin, request, queryset, service, verb: str) -> None:
    done, refused = 0, []
    for obj in queryset:
        try:
            service(request.user, obj.pk)
            done += 1
        except ServiceError as exc:
            refused.append(str(exc))
    if done:
        modeladmin.message_user(request, f"{verb}: {done}", messages.SUCCESS)
    for message in refused:
        modeladmin.message_user(request, message, messages.WARNING)


def _rack_of(obj) -> int | None:
    if isinstance(obj, Rack):
        return obj.pk
    if isinstance(obj, Node):
        return obj.rack_id
    if isinstance(obj, GPU):
        return obj.node.rack_id
    return None


class AuditedAdmin(admin.ModelAdmin):
    """Inventory edits made in the admin are written to the audit log, and a
    change to a rack, node or GPU advances the rack's version (in the admin's
    transaction) so live consoles repaint it."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        audit.record(
            request.user,
            f"{obj._meta.model_name}.{'change' if change else 'create'}",
            obj,
            after={name: str(form.cleaned_data.get(name)) for name in form.changed_data},
        )
        rack_id = _rack_of(obj)
        if rack_id is not None:
            bump_versions([rack_id])

    def delete_model(self, request, obj):
        audit.record(request.user, f"{obj._meta.model_name}.delete", obj)
        super().delete_model(request, obj)


class NodeInline(admin.TabularInline):
    model = Node
    fields = ["slot", "hostname", "state", "state_reason"]
    readonly_fields = ["state", "state_reason"]
    extra = 0


@admin.register(Rack)
class RackAdmin(AuditedAdmin):
    list_display = [
        "name",
        "kind",
        "site",
        "row",
        "position",
        "nodes_per_domain",
        "gpus_per_node",
        "spare_nodes",
    ]
    list_filter = ["kind", "site", "row"]
    search_fields = ["name", "external_id"]
    inlines = [NodeInline]

    def get_readonly_fields(self, request, obj=None):
        # A rack's shape follows its nodes (create_rack, import_topology); editing
        # the numbers here would not add or remove a node.
        if obj is None:
            return ["version"]
        return ["version", "kind", "nodes_per_domain", "gpus_per_node"]


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["hostname", "rack", "slot", "state", "state_reason", "state_changed_at"]
    list_filter = ["state", "rack__site", "rack"]
    search_fields = ["hostname"]
    readonly_fields = ["state", "state_reason", "state_changed_at", "last_heartbeat_at"]
    actions = ["drain", "undrain", "mark_failed", "return_to_service"]

    @admin.action(description="Drain selected nodes")
    def drain(self, request, queryset):
        _run_service(self, request, queryset, node_services.drain_node, "Drained")

    @admin.action(description="Undrain selected nodes")
    def undrain(self, request, queryset):
        _run_service(self, request, queryset, node_services.undrain_node, "Undrained")

    @admin.action(description="Mark selected nodes failed")
    def mark_failed(self, request, queryset):
        _run_service(self, request, queryset, node_services.mark_node_failed, "Marked failed")

    @admin.action(description="Return selected nodes to service")
    def return_to_service(self, request, queryset):
        _run_service(self, request, queryset, node_services.return_node_to_service, "Returned")


@admin.register(GPU)
class GPUAdmin(AuditedAdmin):
    list_display = ["__str__", "uuid", "health", "last_error"]
    list_filter = ["health"]
    search_fields = ["uuid", "node__hostname"]
    # Health comes from the node agents through the health service, which also
    # fails or drains the node and recovers its jobs; an edit here would do none.
    readonly_fields = ["health", "last_error", "last_xid", "health_changed_at"]


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ["name", "cohort", "weight"]
    filter_horizontal = ["members"]
    # Changed through fleet.services.tenants.quotas only (operators, audited).
    readonly_fields = ["cohort", "weight"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "tenant",
        "owner",
        "num_gpus",
        "num_nodes",
        "locality",
        "priority",
        "state",
        "submitted_at",
    ]
    list_filter = ["state", "locality", "tenant"]
    search_fields = ["name", "owner__username"]
    actions = ["cancel"]

    @admin.action(description="Cancel selected jobs")
    def cancel(self, request, queryset):
        _run_service(self, request, queryset, job_services.cancel_job, "Cancelled")

    def has_change_permission(self, request, obj=None):
        # Needed for the cancel action to be offered; the form itself stays read-only.
        return (obj is None and request.user.is_superuser) or super().has_change_permission(request, obj)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ["job", "gpu", "created_at", "released_at"]
    list_filter = ["released_at"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_name", "action", "object_type", "object_repr", "message"]
    list_filter = ["action", "object_type"]
    search_fields = ["object_repr", "actor_name", "message"]


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "state", "title", "cost_gpu_hours", "progress", "created_at"]
    list_filter = ["kind", "state"]
    search_fields = ["title"]
    actions = ["approve", "reject", "cancel"]

    def has_change_permission(self, request, obj=None):
        # Offer the approve/reject/cancel actions; the form itself stays read-only.
        return obj is None and request.user.is_superuser

    @admin.action(description="Approve selected actions")
    def approve(self, request, queryset):
        _run_service(self, request, queryset, action_services.approve, "Approved")

    @admin.action(description="Reject selected actions")
    def reject(self, request, queryset):
        _run_service(self, request, queryset, action_services.reject, "Rejected")

    @admin.action(description="Cancel selected actions")
    def cancel(self, request, queryset):
        _run_service(self, request, queryset, action_services.cancel, "Cancelled")


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(AuditedAdmin):
    list_display = ["kind", "mode", "updated_at"]


@admin.register(AgentToken)
class AgentTokenAdmin(ReadOnlyAdmin):
    list_display = ["node", "created_at"]
    exclude = ["key"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    # Changes go through /api/webhooks/ (validated and audited); the secret is never shown.
    list_display = ["id", "url", "event_types", "active", "created_at"]
    list_filter = ["active"]
    exclude = ["secret"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "endpoint", "event_type", "state", "attempts", "last_status_code", "created_at"]
    list_filter = ["state", "event_type"]
    actions = ["redeliver"]

    def has_change_permission(self, request, obj=None):
        # Offer the redeliver action; the form itself stays read-only.
        return obj is None and request.user.is_superuser

    @admin.action(description="Redeliver selected deliveries")
    def redeliver(self, request, queryset):
        _run_service(self, request, queryset, webhook_services.redeliver, "Redelivered")
