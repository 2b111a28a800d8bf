"""Domain errors shared by the spawner, the services and the CLI.

Each carries an HTTP status so handlers map them once, a user-facing message kept
apart from whatever gets logged, and a short ``reason`` label (JupyterHub's spawn-failure
metrics label refused spawns with it: see ``trainhub.spawner.errors``).
"""


class TrainhubError(Exception):
    status_code = 400
    reason = "invalid"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(TrainhubError):
    status_code = 404
    reason = "not-found"


class Forbidden(TrainhubError):
    status_code = 403
    reason = "forbidden"


class InvalidRequest(TrainhubError):
    status_code = 400


class TooLarge(TrainhubError):
    status_code = 413


class InsufficientStorage(TrainhubError):
    status_code = 507


class UnknownProfile(TrainhubError):
    status_code = 400
    reason = "profile"


class ProfileNotAllowed(TrainhubError):
    status_code = 403
    reason = "profile"


class QuotaExceeded(TrainhubError):
    status_code = 403
    reason = "quota"


class NoFreeGPUs(TrainhubError):
    status_code = 409
    reason = "capacity"


class ProfileDoesNotFit(TrainhubError):
    """A profile asks for more (CPUs, memory, GPUs) than any node it may use offers in all: it could never start, so
    it is refused at once instead of waiting Pending."""

    status_code = 400
    reason = "capacity"


class Conflict(TrainhubError):
    status_code = 409
    reason = "conflict"


class TooManyQueued(TrainhubError):
    """A user's queue is at its cap (``JobsService.max_queued_per_user``): try again once some start or are cancelled."""

    status_code = 429
    reason = "queue-cap"
