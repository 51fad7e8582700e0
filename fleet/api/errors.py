"""Map service errors to HTTP: InvalidInput 400 (field messages), a body too big
or otherwise refused by Django 400 (JSON, not Django's HTML page), NotAllowed 403,
Conflict 409, a missing object 404; a cluster that did not take a change
(ClusterDown) 503 with Retry-After, nothing changed; a database that does not
answer 503 with Retry-After (the request may be retried; a job submission with an
Idempotency-Key is safe to retry).

A 400's messages are keyed by one flat path per field, whether the parser or a
service found the fault: ``quotas[1].nominal_gpus``, ``reserved_racks[0]``,
``slurm.script`` (:func:`flat_errors`); a client reads one shape from every
endpoint."""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found
from django.views.defaults import server_error as django_server_error
from rest_framework import status
from rest_framework.exceptions import NotAuthenticated, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from fleet.services.errors import ClusterDown, Conflict, InvalidInput, NotAllowed

log = logging.getLogger(__name__)

DATABASE_ERRORS = (OperationalError, InterfaceError)
DATABASE_UNAVAILABLE = "The database is not answering; retry in a few seconds."


def _retry_after() -> str:
    return str(settings.RACKWISE_DB_RETRY_AFTER_S)


def flat_errors(detail: object, path: str = "") -> dict[str, list[str]]:
    """A serializer's nested messages keyed by their field's path, in the
    services' form: a nested field ``parent.child``, an item of a list
    ``parent[i]`` (DRF keys a list's items by index, in a dict or a list with
    empty entries for the good ones)."""
    if isinstance(detail, dict):
        items = detail.items()
    elif isinstance(detail, list) and any(isinstance(d, (dict, list)) for d in detail):
        items = enumerate(detail)
    else:
        messages = detail if isinstance(detail, list) else [detail]
        return {path or "non_field_errors": [str(m) for m in messages]}
    out: dict[str, list[str]] = {}
    for key, value in items:
        if isinstance(key, int):
            where = f"{path}[{key}]"
        else:
            where = f"{path}.{key}" if path else str(key)
        out.update(flat_errors(value, where))
    return out


def exception_handler(exc, context):
    if isinstance(exc, InvalidInput):
        return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ValidationError) and isinstance(exc.detail, dict):
        return Response(flat_errors(exc.detail), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Conflict):
        return Response({"detail": str(exc), **exc.extra}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, NotAllowed):
        return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, ClusterDown):
        log.warning("cluster unavailable, answered 503: %s", exc)
        return Response(
            {"detail": str(exc)},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, NotAuthenticated) and (scheme := _unknown_scheme(context)):
        response = drf_exception_handler(exc, context)
        response.data = {
            "detail": f"The Authorization scheme {scheme!r} is not accepted: "
            "send 'Authorization: Token <key>' (Bearer works too), or log in to the console."
        }
        return response
    if isinstance(exc, ObjectDoesNotExist):
        return Response({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {
                "detail": f"The request body is over {limit:,} bytes, the most the API takes: send less "
                "(a batch in several requests)."
            },
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, SuspiciousOperation):  # Django refused the request's form (too many fields, ...)
        return Response({"detail": f"Bad request: {exc}"}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DATABASE_ERRORS):
        log.warning("database error answered 503: %s", exc)
        return Response(
            {"detail": DATABASE_UNAVAILABLE},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": _retry_after()},
        )
    return drf_exception_handler(exc, context)


def _unknown_scheme(context) -> str:
    """The scheme of an Authorization header no authenticator took ("" if none was sent)."""
    request = context.get("request")
    header = request.META.get("HTTP_AUTHORIZATION", "") if request is not None else ""
    return header.split(" ", 1)[0][:20] if header.strip() else ""


def not_found(request, exception=None):
    """Django's 404 handler: ``{"detail": "Not found."}`` for API paths (an id the
    router's pattern does not take, a mistyped path), the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


@csrf_exempt  # it changes nothing; a POST with a session cookie must get this 404, not the CSRF page
def unknown_api_path(request: HttpRequest) -> JsonResponse:
    """The API's last route: any other path under /api/ is a JSON 404, with
    DEBUG on too (Django's debug page would answer HTML there, not handler404),
    naming the path with its trailing slash when that one exists."""
    detail = f"Not found: no API path {request.path!r}."
    if _a_route_takes(request.path + "/"):
        detail += f" Did you mean {request.path + '/'!r}? API paths end in a slash."
    else:
        detail += " The API's paths are listed at /api/docs/."
    return JsonResponse({"detail": detail}, status=404)


def _a_route_takes(path: str) -> bool:
    """Does a route other than this last one (which takes every path) take ``path``?"""
    try:
        return resolve(path).func is not unknown_api_path
    except Resolver404:
        return False


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's handler500 for pages (and for anything outside DRF views, such as
    middleware): a database error becomes a 503 with Retry-After; JSON for the API
    and for clients asking for JSON, a short text page otherwise."""
    exc = sys.exc_info()[1]
    if not isinstance(exc, DATABASE_ERRORS):
        return django_server_error(request)
    wants_json = request.path.startswith("/api/") or "json" in request.headers.get("Accept", "")
    if wants_json:
        response: HttpResponse = JsonResponse({"detail": DATABASE_UNAVAILABLE}, status=503)
    else:
        response = HttpResponse(DATABASE_UNAVAILABLE, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = _retry_after()
    return response
