"""The exceptions leasehold raises.

Every error is a :class:`leasehold.Error`; the message names the cause as
the command line's do (the argument, the key, the file or row).
"""


class Error(Exception):
    """Anything leasehold reports."""


class LeaseHeld(Error):
    """The key is held by someone else (and the wait, if any, ran out)."""


class LeaseLost(Error):
    """The lease or claim may no longer be acted on: it was lost, released,
    settled, or its local deadline passed."""


class InvalidInput(Error, ValueError):
    """Bad input, named (a TTL of zero, a hostile key, an unknown store
    scheme...). Also a ValueError. Nothing was changed."""


class StoreError(Error):
    """The store failed (an I/O error, a busy database past its timeout,
    an unreachable server). Nothing half-applied."""


class Forked(Error):
    """A handle of the parent used in a process made by ``os.fork()``: the
    child can never renew, release or settle its parent's leases and jobs,
    nor use its connections. Open a store in the child instead."""


class NotFound(Error, LookupError):
    """No such job."""


__all__ = [
    "Error",
    "LeaseHeld",
    "LeaseLost",
    "InvalidInput",
    "StoreError",
    "Forked",
    "NotFound",
]
