"""Errors raised by :mod:`trainhub.data`.

Every error carries a message meant for the person running the job: it names the URL
involved and says what to do next. All derive from :class:`DataError`, so callers that
only want to report can catch one class.
"""


class DataError(Exception):
    """Base class for trainhub.data errors."""


class InvalidURLError(DataError, ValueError):
    """A URL (or storage options) that fsspec cannot turn into a filesystem."""


class IndexNotFoundError(DataError, FileNotFoundError):
    """A shard folder has no ``index.json``."""


class ShardNotFoundError(DataError, FileNotFoundError):
    """A shard named by the index (or by the caller) does not exist."""


class CorruptShardError(DataError):
    """A shard that is not a readable tar file, or whose samples are malformed."""


class EmptySourceError(DataError):
    """``pack`` found no files to pack under the source prefix."""
