"""The sidecar's errors, each an HTTP status (``http_base`` maps them)."""


class Conflict(RuntimeError):
    """The request cannot be served in the worker's current role or state (HTTP 409)."""


class NotFound(KeyError):
    """No such request here (HTTP 404)."""


class BadRequest(ValueError):
    """The request cannot be served at all (HTTP 400)."""
