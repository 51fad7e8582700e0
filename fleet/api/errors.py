"""Map service errors to HTTP: InvalidInput 400 (field messages), NotAllowed 403,
Conflict 409, a missing object 404."""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.http import JsonResponse
from django.views.defaults import page_not_found
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from fleet.services.errors import Conflict, InvalidInput, NotAllowed


def exception_handler(exc, context):
    if isinstance(exc, InvalidInput):
        return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Conflict):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, NotAllowed):
        return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, ObjectDoesNotExist):
        return Response({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return drf_exception_handler(exc, context)


def not_found(request, exception=None):
    """Django's 404 handler: ``{"detail": "Not found."}`` for API paths (an id the
    router's pattern does not take, a mistyped path), the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)
