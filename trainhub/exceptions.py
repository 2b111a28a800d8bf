"""Domain errors shared by the spawner, the services and the CLI.

Each carries an HTTP status so handlers map them once, and a user-facing message
kept apart from whatever gets logged.
"""


class TrainhubError(Exception):
    status_code = 400

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(TrainhubError):
    status_code = 404


class Forbidden(TrainhubError):
    status_code = 403


class InvalidRequest(TrainhubError):
    status_code = 400


class UnknownProfile(TrainhubError):
    status_code = 400


class ProfileNotAllowed(TrainhubError):
    status_code = 403


class QuotaExceeded(TrainhubError):
    status_code = 403


class NoFreeGPUs(TrainhubError):
    status_code = 409


class Conflict(TrainhubError):
    status_code = 409
