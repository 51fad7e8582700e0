from fleet.permissions import role_of


def role(request) -> dict:
    user_role = role_of(getattr(request, "user", None))
    return {"rackwise_role": user_role, "rackwise_role_label": user_role.label if user_role else ""}
