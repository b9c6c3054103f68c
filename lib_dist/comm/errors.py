"""Errors raised by communicators. Each message names the rank, the operation and the peer."""


class CommError(RuntimeError):
    """A point-to-point operation or a collective could not complete."""


class CommTimeout(CommError):
    """An operation did not complete within the communicator's timeout."""


class DeadlockError(CommError):
    """Every live rank is waiting on a message that no rank will ever send."""


class MismatchError(CommError):
    """A send and its matching receive disagree on shape or dtype."""


class PeerFailed(CommError):
    """The peer of an operation raised or returned before completing it."""
