"""Errors raised by services. The API maps them to HTTP statuses (400, 403, 409,
503 for ClusterDown);
commands print them as one line."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: something the caller asked for cannot be done."""


class InvalidInput(ServiceError):
    """The request is malformed or can never be satisfied (HTTP 400).

    ``errors`` maps a field name (or ``non_field_errors``) to messages that say what
    is wrong and what would work instead."""

    def __init__(self, errors: dict[str, list[str]] | str) -> None:
        if isinstance(errors, str):
            errors = {"non_field_errors": [errors]}
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))


class Conflict(ServiceError):
    """The request conflicts with the object's current state (HTTP 409).
    ``extra``: more fields for the answer beside ``detail``."""

    def __init__(self, message: str, **extra) -> None:
        super().__init__(message)
        self.extra = extra


class NotAllowed(ServiceError):
    """The actor's role does not allow this (HTTP 403)."""


class ClusterDown(ServiceError):
    """The cluster Rackwise drives did not answer, so a change that must be
    mirrored there was refused and nothing changed (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)
