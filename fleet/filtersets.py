import datetime

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

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


class UTCIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, handed to the database in UTC: PostgreSQL refuses an offset
    beyond ±15:59 ("0092-10-31T05:17+21:06" was a 500)."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(datetime.UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError(
                "a time between years 1 and 9999 (ISO 8601)", code="invalid"
            ) from None


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class AuditEventFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(lookup_expr="startswith")
    since = UTCIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")

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


# --- Console page filters ---------------------------------------------------------
# The pages read their query strings through these forms, so a NUL (PostgreSQL
# refuses it in a string) or a digit like "²" (str.isdigit() but not int()) is a 400
# that says which filter is wrong, never a 500.


class _PageFilterForm(forms.Form):
    def errors_text(self) -> str:
        return "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())


# The jobs list's orders: name -> (label, ORDER BY). Newest first by default.
JOB_SORTS = {
    "newest": ("newest first", ("-id",)),
    "oldest": ("oldest first", ("id",)),
    "priority": ("highest priority", ("-priority", "id")),
    "size": ("largest", ("-num_gpus", "id")),
    "state": ("state", ("state", "-id")),
    "tenant": ("tenant", ("tenant__name", "-id")),
    "name": ("name", ("name", "-id")),
}


class JobPageFilterForm(_PageFilterForm):
    state = forms.ChoiceField(
        required=False, choices=[("active", "active"), ("all", "all"), *JobState.choices]
    )
    tenant = forms.CharField(required=False, max_length=100)
    q = forms.CharField(required=False, max_length=200, strip=True)
    sort = forms.ChoiceField(required=False, choices=[(k, v[0]) for k, v in JOB_SORTS.items()])
    page = forms.IntegerField(required=False, min_value=1, max_value=10**6)

    def clean_sort(self) -> str:
        return self.cleaned_data["sort"] or "newest"

    def clean_page(self) -> int:
        return self.cleaned_data["page"] or 1

    def clean_state(self) -> str:
        return self.cleaned_data["state"] or "active"

    def job_id(self) -> int | None:
        """``q`` as a job id, when it is one (ASCII digits within the id column)."""
        q = self.cleaned_data["q"]
        return int(q) if q.isascii() and q.isdecimal() and len(q) <= 18 else None


class ActionPageFilterForm(_PageFilterForm):
    state = forms.ChoiceField(
        required=False, choices=[("open", "open"), ("all", "all"), *ActionState.choices]
    )
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *ActionKind.choices])

    def clean_state(self) -> str:
        return self.cleaned_data["state"] or "open"
