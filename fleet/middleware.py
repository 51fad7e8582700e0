from __future__ import annotations

import uuid

from django.contrib.auth.middleware import LoginRequiredMiddleware

from fleet.services.audit import current_request_id


class LoginRequiredEverywhereMiddleware(LoginRequiredMiddleware):
    """Every page needs a login (Django's LoginRequiredMiddleware), except the API,
    where DRF authenticates tokens as well as sessions and answers 401/403 itself
    instead of redirecting. Also tags the request with an id for the audit log."""

    def process_view(self, request, view_func, view_args, view_kwargs):
        current_request_id.set(uuid.uuid4())
        if request.path_info.startswith("/api/"):
            return None
        return super().process_view(request, view_func, view_args, view_kwargs)
