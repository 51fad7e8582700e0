"""The OpenAPI schema's error responses, declared on every operation they can
come from, in the shapes ``fleet.api.errors`` really sends:

* 400 ``ValidationError``: ``{field: [message, ...]}``, a nested field by its path
  (``quotas[1].nominal_gpus``, ``non_field_errors`` for the whole request), or
  ``{"detail": message}`` for a body that is not JSON;
* 401, 403, 404, 409, 415, 429, 503 ``Error``: ``{"detail": message}``.

Which operation gets which (a generated client then knows them all):

1. 400: writes (a body is parsed) and reads with query parameters (filters,
   ``limit``/``offset``, ``ids``, ``hours``).
2. 401: every operation with an authentication scheme (not the webhook cluster's
   HMAC-signed callback, which takes no login).
3. 403: every operation (a role, an agent token or a signature is checked).
4. 404: operations on one object (a path parameter).
5. 415: writes (a body in a media type no parser takes, or malformed multipart).
6. 409: writes (a service refuses a state change), and reads a view names in
   ``conflict_actions`` (a job's export, 409 until the job is placed).
7. 429: every operation (throttled).
8. 503: every operation (the database, or for a node change the cluster, is
   not answering; Retry-After says when to try again).
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent

ERROR = ResolvedComponent(
    name="Error",
    type=ResolvedComponent.SCHEMA,
    object="Error",
    schema={
        "type": "object",
        "properties": {"detail": {"type": "string", "description": "What went wrong, in words."}},
        "required": ["detail"],
    },
)
VALIDATION_ERROR = ResolvedComponent(
    name="ValidationError",
    type=ResolvedComponent.SCHEMA,
    object="ValidationError",
    schema={
        "type": "object",
        "description": (
            "Messages by field, a nested one by its path (``quotas[1].nominal_gpus``, "
            "``slurm.script``; ``non_field_errors`` for the request as a whole), "
            "or ``detail`` for a body that could not be parsed."
        ),
        "additionalProperties": {
            "oneOf": [
                {"type": "array", "items": {"type": "string"}},
                {"type": "string"},
            ]
        },
    },
)
DESCRIPTIONS = {
    400: "Invalid input: messages by field.",
    401: "No or invalid credentials.",
    403: "Your role (or token, or signature) does not allow this.",
    404: "No such object, or not one you may see.",
    409: "Conflicts with the object's current state.",
    415: "The body's Content-Type is not one the API parses (JSON, form, multipart).",
    429: "Too many requests; retry after the time in Retry-After.",
    503: "The database (or, for a node change, the cluster) is not answering; nothing changed; "
    "retry after the time in Retry-After.",
}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


class RackwiseAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, with the error responses each operation can give."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        registry.register_on_missing(ERROR)
        registry.register_on_missing(VALIDATION_ERROR)
        for code in self.error_codes(operation):
            component = VALIDATION_ERROR if code == 400 else ERROR
            # A view's own description of an error (extend_schema) is kept; the body
            # shape is the same everywhere, so it is added where missing.
            response = operation["responses"].setdefault(str(code), {"description": DESCRIPTIONS[code]})
            response.setdefault("content", {"application/json": {"schema": component.ref}})
        return operation

    def _map_serializer(self, serializer, direction, bypass_extensions=False):
        """A request body that refuses unknown fields (``KnownFieldsOnly``) says so:
        ``additionalProperties: false``, so a generated client does too."""
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def error_codes(self, operation: dict) -> list[int]:
        """The error statuses this operation can answer (see the module docstring)."""
        method = self.method
        params = operation.get("parameters", [])
        codes = {403, 429, 503}
        if method in WRITES or any(p.get("in") == "query" for p in params):
            codes.add(400)
        if method in WRITES:
            codes.add(415)
        if getattr(self.view, "authentication_classes", None):
            codes.add(401)
        if any(p.get("in") == "path" for p in params):
            codes.add(404)
        if method in WRITES or getattr(self.view, "action", None) in getattr(
            self.view, "conflict_actions", ()
        ):
            codes.add(409)
        return sorted(codes)
