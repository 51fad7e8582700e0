"""The only writer of ``HealthRule`` rows: operators add, change and remove the
rules that turn a GPU's signals into verdicts (fleet.gpu_verdicts);
every change is audited (``health_rule.create|update|delete``)."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from fleet import gpu_verdicts as verdicts
from fleet.choices import Role
from fleet.models import HealthRule
from fleet.permissions import has_role
from fleet.services import audit
from fleet.services.errors import Conflict, InvalidInput, NotAllowed

FIELDS = ("signal", "test", "threshold", "window_s", "verdict", "enabled", "description")


def _require_operator(actor) -> None:
    if not has_role(actor, Role.OPERATOR):
        raise NotAllowed("only operators can change health rules")


def _row(rule: HealthRule) -> dict:
    return {f: getattr(rule, f) for f in FIELDS}


def _check(values: dict) -> None:
    errors = verdicts.rule_errors(values["signal"], values["test"], values["threshold"], values["window_s"])
    if errors:
        raise InvalidInput(errors)


def create_rule(actor, name: str, values: dict) -> HealthRule:
    _require_operator(actor)
    _check(values)
    try:
        with transaction.atomic():
            rule = HealthRule.objects.create(name=name, **values)
            audit.record(actor, "health_rule.create", rule, after=_row(rule), message=describe(rule))
    except IntegrityError:
        raise Conflict(f"a health rule named {name!r} exists; change it, or choose another name") from None
    return rule


def update_rule(actor, name: str, changes: dict) -> HealthRule:
    _require_operator(actor)
    with transaction.atomic():
        rule = HealthRule.objects.select_for_update().filter(name=name).first()
        if rule is None:
            raise InvalidInput({"name": [f"no health rule {name!r}"]})
        before = _row(rule)
        after = {**before, **{k: v for k, v in changes.items() if k in FIELDS}}
        _check(after)
        if after != before:
            for field, value in after.items():
                setattr(rule, field, value)
            rule.save()
            audit.record(
                actor, "health_rule.update", rule, before=before, after=after, message=describe(rule)
            )
    return rule


def delete_rule(actor, name: str) -> None:
    _require_operator(actor)
    with transaction.atomic():
        rule = HealthRule.objects.select_for_update().filter(name=name).first()
        if rule is None:
            raise InvalidInput({"name": [f"no health rule {name!r}"]})
        audit.record(actor, "health_rule.delete", rule, before=_row(rule), message=describe(rule))
        rule.delete()


def active_rules() -> list[verdicts.Rule]:
    return [
        verdicts.Rule(r.name, r.signal, r.test, r.threshold, r.window_s, r.verdict)
        for r in HealthRule.objects.filter(enabled=True).order_by("name")
    ]


def describe(rule: HealthRule) -> str:
    test = {
        "rate_above": f"rises faster than {rule.threshold:g}/h over {rule.window_s} s",
        "above": f"is above {rule.threshold:g}",
        "set": "is set",
    }[rule.test]
    state = "" if rule.enabled else " (disabled)"
    return f"{rule.name}: {rule.signal} {test} -> {rule.verdict}{state}"
