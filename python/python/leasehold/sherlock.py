"""A drop-in for the locks of the `sherlock` library, on leasehold.

Change one import and keep the code::

    import leasehold.sherlock as sherlock

    lock = sherlock.FileLock("nightly-etl", namespace="tap-x", expire=60, timeout=10)
    with lock:
        run()

``FileLock(lock_name, namespace=None, expire=60, timeout=10,
retry_interval=0.1, client=pathlib.Path("/tmp/sherlock"))`` keeps its
locks in a leasehold lease directory (``client``); ``Lock(lock_name, ...)``
uses the store set by ``configure(store=URL, ...)`` (``sqlite:PATH``,
``file:DIR``, ``postgres://...``). The semantics are sherlock's:

- ``acquire(blocking=True)`` returns True, or raises
  :class:`LockTimeoutException` after about ``timeout`` seconds (it is
  woken at once by a release, and retries at least every
  ``retry_interval``); ``acquire(False)`` returns a bool. Not re-entrant:
  the holder's second acquire is False (or times out, blocking).
- ``release()`` returns None; it raises ``LockException("Lock was not set
  by this process.")`` only when this object never acquired, and is silent
  when the lock expired and someone else holds it now.
- ``renew()`` returns whether the lock was renewed (False once it expired
  or was taken), and raises the same ``LockException`` before any acquire.
- ``locked()`` is True when anyone holds the lock. ``expire=None`` never
  expires (a year: the longest lease). A context manager; released when
  the object is garbage-collected.

What sherlock does not: a lock always expires ``expire`` seconds after its
last renewal, even when its holder is SIGKILLed mid-write (no record left
stuck); two processes that are both PID 1 never both hold it (owners are
random ids, not pids); a forked child cannot release or renew its parent's
lock (:class:`LockException` naming the fork); ``token`` is the lock's
fencing token; ``keep_alive=True`` renews it about every expire/3 on a
thread of the crate's for as long as the object holds it; a FileLock's
``durable=False`` skips the disk sync of each grant, as sherlock does.
"""

import os
import pathlib
import threading

import leasehold
from .errors import Forked, LeaseHeld, LeaseLost

__all__ = [
    "configure",
    "Lock",
    "FileLock",
    "LockException",
    "LockTimeoutException",
]

#: The longest a lease may live: what ``expire=None`` means.
_NEVER = 365 * 24 * 3600.0


class LockException(Exception):
    """Generic lock error (sherlock's)."""


class LockTimeoutException(Exception):
    """The lock could not be acquired within ``timeout`` (sherlock's)."""


class _Configuration:
    def __init__(self):
        self.store = None
        self.namespace = None
        self.expire = 60
        self.timeout = 10
        self.retry_interval = 0.1


_configuration = _Configuration()


def configure(**kwargs):
    """Set the defaults of every lock made afterwards: ``store`` (a
    leasehold URL, for :class:`Lock`), ``namespace``, ``expire``,
    ``timeout``, ``retry_interval``."""
    for name, value in kwargs.items():
        if not hasattr(_configuration, name):
            raise ValueError(
                f"configure: unknown setting {name!r} (store, namespace, expire, timeout, retry_interval)"
            )
        setattr(_configuration, name, value)


_stores = {}
_stores_lock = threading.Lock()


def _open(url):
    """One store per URL and process (a forked child opens its own)."""
    key = (os.getpid(), url)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = leasehold.open(url)
            _stores[key] = store
        return store


class BaseLock:
    """What :class:`Lock` and :class:`FileLock` share (sherlock's BaseLock)."""

    def __init__(self, lock_name, **kwargs):
        self.lock_name = lock_name
        self.namespace = kwargs.get("namespace") or _configuration.namespace
        self.expire = kwargs["expire"] if "expire" in kwargs else _configuration.expire
        self.timeout = kwargs["timeout"] if "timeout" in kwargs else _configuration.timeout
        self.retry_interval = kwargs.get("retry_interval", _configuration.retry_interval)
        self.keep_alive = bool(kwargs.get("keep_alive", False))
        self._lease = None
        self._acquired = False

    @property
    def _key_name(self):
        if self.namespace is not None:
            return "%s_%s" % (self.namespace, self.lock_name)
        return self.lock_name

    def _store(self):
        raise NotImplementedError("Must be implemented in the sub-class.")

    @property
    def _ttl(self):
        if self.expire is None:
            return _NEVER
        return max(float(self.expire), 0.001)

    def _try(self, wait):
        try:
            lease = self._store().lock(
                self._key_name, ttl=self._ttl, wait=wait, keep_alive=self.keep_alive
            )
        except LeaseHeld:
            return False
        except Forked as e:
            raise LockException(str(e)) from e
        previous, self._lease = self._lease, lease
        self._acquired = True
        if previous is not None:
            # Our own earlier grant ran out and this one replaced it.
            try:
                previous.release()
            except leasehold.Error:
                pass
        return True

    def acquire(self, blocking=True):
        """Acquire the lock: True; blocking, raise LockTimeoutException after
        about ``timeout`` seconds; not blocking, False when it is held."""
        if not blocking:
            return self._try(0)
        if self.timeout >= 0 and self._try(float(self.timeout)):
            return True
        raise LockTimeoutException(
            "Timeout elapsed after %s seconds while trying to acquiring lock." % self.timeout
        )

    def release(self):
        """Release the lock (None). Raises LockException only when this
        object never acquired it; silent when it expired and someone else
        holds it now."""
        if not self._acquired:
            raise LockException("Lock was not set by this process.")
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                lease.release()
            except LeaseLost:
                pass  # it expired (and may be someone else's now): sherlock is silent
            except Forked as e:
                self._lease = lease
                raise LockException(str(e)) from e

    def renew(self):
        """Extend the lock to ``expire`` from now: True, or False once it
        expired or was taken."""
        if not self._acquired:
            raise LockException("Lock was not set by this process.")
        if self._lease is None:
            return False
        try:
            self._lease.renew()
            return True
        except LeaseLost:
            return False
        except Forked as e:
            raise LockException(str(e)) from e

    def locked(self):
        """Whether anyone holds the lock now."""
        return len(self._store().holders(self._key_name)) > 0

    @property
    def token(self):
        """The fencing token of the grant this object holds (None if none)."""
        return None if self._lease is None else self._lease.token

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.release()

    def __del__(self):
        try:
            self.release()
        except LockException:
            pass
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class Lock(BaseLock):
    """A lock on the store set by :func:`configure` (``store=URL``)."""

    def __init__(self, lock_name, **kwargs):
        if "client" in kwargs:
            raise TypeError("Lock object does not accept a custom client object")
        super().__init__(lock_name, **kwargs)

    def _store(self):
        if _configuration.store is None:
            raise LockException(
                "Lock backend has not been configured: call leasehold.sherlock.configure(store=URL)"
            )
        return _open(_configuration.store)


class FileLock(BaseLock):
    """A lock kept in a lease directory (``client``, default
    ``/tmp/sherlock``), made with its parents if missing.

    ``durable=True`` (the default) syncs each grant to disk (one
    ``fdatasync`` per acquire + release), so a power loss never hands its
    fencing token out twice; ``durable=False`` syncs nothing, as sherlock's
    FileLock does, and is about ten times faster."""

    def __init__(self, lock_name, **kwargs):
        super().__init__(lock_name, **kwargs)
        client = kwargs.get("client")
        self.client = pathlib.Path("/tmp/sherlock") if client is None else pathlib.Path(client)
        self.durable = bool(kwargs.get("durable", True))
        self.client.mkdir(parents=True, exist_ok=True)

    def _store(self):
        return _open("file:%s%s" % (self.client, "" if self.durable else "?durable=false"))
