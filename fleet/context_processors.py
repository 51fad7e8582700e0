from fleet.permissions import role_of
from fleet.services.read.attention import awaiting_approval


def role(request) -> dict:
    """The user's role, and (for users with one) the nav badge's count of
    actions awaiting approval."""
    user = getattr(request, "user", None)
    user_role = role_of(user)
    context = {"rackwise_role": user_role, "rackwise_role_label": user_role.label if user_role else ""}
    if user_role is not None:
        context["awaiting"] = awaiting_approval(user)
    return context
