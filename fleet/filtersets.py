import django_filters

from fleet.choices import ActionKind, ActionState, JobState, NodeState, RackKind
from fleet.models import Action, AuditEvent, Job, Node, Rack


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    owner = django_filters.CharFilter(field_name="owner__username")
    tenant = django_filters.CharFilter(field_name="tenant__name")

    class Meta:
        model = Job
        fields = ["state", "owner", "tenant", "locality"]


class RackFilterSet(django_filters.FilterSet):
    kind = django_filters.MultipleChoiceFilter(choices=RackKind.choices)

    class Meta:
        model = Rack
        fields = ["site", "row", "kind"]


class NodeFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=NodeState.choices)
    rack = django_filters.CharFilter(field_name="rack__name")
    hostname = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["state", "rack", "hostname"]


class AuditEventFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(lookup_expr="startswith")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")

    class Meta:
        model = AuditEvent
        fields = ["actor", "action", "object_type", "object_id", "since"]


class ActionFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=ActionState.choices)
    kind = django_filters.MultipleChoiceFilter(choices=ActionKind.choices)
    job = django_filters.NumberFilter(field_name="jobs__id")

    class Meta:
        model = Action
        fields = ["state", "kind", "job"]
