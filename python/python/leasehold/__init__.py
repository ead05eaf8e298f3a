"""leasehold: expiring, fenced leases (locks) and a race-free job queue.

The rules are the leasehold Rust crate's (this package binds it: no second
implementation); stores are the same URLs as the command line's::

    import leasehold

    store = leasehold.open("sqlite:leasehold.db")     # or file:DIR, postgres://...
    with store.lock("nightly-etl", ttl=30, wait=10, label="tap-x") as lease:
        lease.check()              # raises leasehold.LeaseLost once lost
        write_with_fence(lease.token)

    q = store.queue("requests")
    job_id = q.push({"tile": 7})
    job = q.claim(lease=30)
    if job is not None:
        handle(job.json())
        job.complete()

Blocking calls release the GIL, and a wait ends within about 100 ms of
Ctrl-C. A lease keeps itself alive (renewed about every ttl/3 on a thread
of the crate's) until released, lost, or garbage-collected. After
``os.fork()`` the child never touches its parent's leases, jobs or
connections (:class:`Forked`); it opens its own store.
"""

import json as _json

from . import _native, errors
from .errors import Error, Forked, InvalidInput, LeaseHeld, LeaseLost, NotFound, StoreError

__all__ = ["open", "Store", "Lease", "Queue", "Job", *errors.__all__]


def _payload(value):
    """bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return _json.dumps(value).encode("utf-8")


class Lease:
    """A held lease (:meth:`Store.lock`): a context manager that releases it
    on exit. ``token`` is its fencing token."""

    __slots__ = ("_native",)

    def __init__(self, native):
        self._native = native

    @property
    def key(self):
        return self._native.key

    @property
    def token(self):
        """The fencing token: larger than every earlier grant's of the key."""
        return self._native.token

    def valid(self):
        """Whether the holder may act now (before its local deadline, not
        lost or released, in the process that acquired it)."""
        return self._native.valid()

    def remaining(self):
        """Seconds left before the local deadline (0.0 once not valid)."""
        return self._native.remaining()

    def check(self):
        """Raise :class:`LeaseLost` unless valid: the check to make before
        every protected action."""
        self._native.check()

    def renew(self):
        """Renew now (the keep-alive does it by itself)."""
        self._native.renew()

    def release(self):
        """Release now; a second call does nothing. Raises
        :class:`LeaseLost` when the lease was seen lost before (a refused
        renewal, or the keep-alive saw the local deadline pass): the work
        under it may not have been protected to the end. (A lease lost
        only at its local deadline is still released in the store by its
        token, in one attempt, so the key is free at once.)"""
        self._native.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return repr(self._native)


class Job:
    """A claimed job: ``id``, ``attempt``, ``token``, ``payload`` (bytes),
    ``json()``; settled by ``complete()`` or ``fail(reason)`` (inside
    :meth:`Queue.work`, by returning or raising instead)."""

    __slots__ = ("_native",)

    def __init__(self, native):
        self._native = native

    id = property(lambda self: self._native.id, doc="The job's id.")
    attempt = property(lambda self: self._native.attempt, doc="This attempt (1 for the first).")
    token = property(lambda self: self._native.token, doc="The claim's fencing token.")
    queue = property(lambda self: self._native.queue, doc="The job's queue.")
    payload = property(lambda self: self._native.payload, doc="The payload (bytes).")
    cancel_requested = property(
        lambda self: self._native.cancel_requested, doc="Someone asked to cancel it."
    )

    def json(self):
        """The payload parsed as JSON."""
        return _json.loads(self._native.payload)

    def text(self):
        """The payload as UTF-8 text."""
        return self._native.payload.decode("utf-8")

    def valid(self):
        """Whether the claim may still be acted on."""
        return self._native.valid()

    def progress(self, fraction, message=""):
        """Report how far this attempt got: ``fraction`` (0.0 to 1.0) and a
        short message, shown by ``Queue.get`` and the dashboard and kept
        with the job. Sent with the claim's next renewal or its settle."""
        self._native.progress(float(fraction), str(message))

    def complete(self, result=None):
        """Mark it done, keeping ``result`` (bytes, str, or JSON) with it."""
        self._native.complete(None if result is None else _payload(result))

    def fail(self, reason):
        """Report this attempt failed; returns the job's state now
        ("scheduled" for a retry, "dead", or "cancelled")."""
        return self._native.fail(str(reason))

    def abandon(self):
        """Give it back (ready again at once)."""
        return self._native.abandon()

    def __repr__(self):
        return repr(self._native)


def _per_job(value, n):
    """``value`` for each of ``n`` jobs: a list as it is, else repeated."""
    if value is None or isinstance(value, (list, tuple)):
        return None if value is None else [None if v is None else str(v) for v in value]
    return [str(value)] * n


class Queue:
    """A queue of a store (:meth:`Store.queue`)."""

    __slots__ = ("_native",)

    def __init__(self, native):
        self._native = native

    @property
    def name(self):
        return self._native.name

    def push(
        self,
        payload,
        priority=0,
        delay=None,
        max_attempts=None,
        unique=None,
        key=None,
        timeout=None,
        unique_for=None,
        unique_states=None,
        after=None,
        after_any=False,
    ):
        """Enqueue ``payload`` (bytes, str, or anything JSON takes); returns
        the job's id. With ``unique``, a job with that key that blocks the
        push (by default a live one: ready, scheduled, running or waiting) is
        returned instead and nothing is created (:meth:`push_unique` says
        which happened); ``unique_for`` (seconds) blocks on any job with
        the key pushed within that period, ``unique_states`` (names, a list
        or ``"ready,scheduled"``) says in which states a job blocks.
        ``key`` is its concurrency key: what the queue's ``per_key`` limit
        counts. ``timeout`` (seconds) limits each attempt's run time,
        counted from its claim: past it the handler is told to stop, the
        attempt fails, and the store renews its claim no further.
        ``after`` (job ids) makes it wait ("waiting") until they are all
        done, and end cancelled if one ends dead or cancelled; with
        ``after_any`` it runs once they all ended, however."""
        return self.push_unique(
            payload, priority, delay, max_attempts, unique, key, timeout, unique_for,
            unique_states, after, after_any,
        )[0]

    def push_unique(self, payload, priority=0, delay=None, max_attempts=None, unique=None,
                    key=None, timeout=None, unique_for=None, unique_states=None, after=None,
                    after_any=False):
        """:meth:`push`, answering ``(id, created)``: ``created`` is false
        when a job with the unique key blocked the push (``id`` is that
        job's, the CLI's ``duplicate_of``)."""
        if unique_states is not None and not isinstance(unique_states, str):
            unique_states = ",".join(unique_states)
        return self._native.push(
            _payload(payload), priority, delay, max_attempts, unique, key, timeout,
            unique_for, unique_states, None if after is None else [int(i) for i in after],
            bool(after_any),
        )

    def push_many(self, payloads, priority=0, delay=None, max_attempts=None, key=None,
                  timeout=None, after=None, after_any=False, unique=None):
        """Enqueue one job per payload (each bytes, str, or anything JSON
        takes) of the list ``payloads``, in order, in one transaction: one
        commit for all, and all of them or, if one is refused, none (the
        error names it by its place in the list, from 0). The options are
        :meth:`push`'s but ``unique_for`` and ``unique_states``, the same
        for every job, and ``key`` and ``unique`` may also be lists, one per
        payload (each job's concurrency key, each job's unique key). At
        most 10,000 payloads and 32 MiB of them a call. Returns the jobs'
        ids, in order; a job whose unique key blocked it answers the id of
        the job that did (the jobs before it in the list count too):
        :meth:`push_many_unique` says which."""
        return [job_id for job_id, _ in self.push_many_unique(
            payloads, priority, delay, max_attempts, key, timeout, after, after_any, unique)]

    def push_many_unique(self, payloads, priority=0, delay=None, max_attempts=None, key=None,
                         timeout=None, after=None, after_any=False, unique=None):
        """:meth:`push_many`, answering ``(id, created)`` per payload, as
        :meth:`push_unique` does for one."""
        if isinstance(payloads, (str, bytes, bytearray, dict)):
            raise TypeError("push_many takes a list of payloads; for one job, use push")
        payloads = [_payload(p) for p in payloads]
        return self._native.push_many(
            payloads, priority, delay, max_attempts, _per_job(key, len(payloads)), timeout,
            None if after is None else [int(i) for i in after], bool(after_any),
            _per_job(unique, len(payloads)),
        )

    def claim(self, lease=30, keep_alive=True):
        """Claim the next ready job (``None`` if none), renewed about every
        lease/3 until settled when ``keep_alive``."""
        job = self._native.claim(float(lease), keep_alive)
        return None if job is None else Job(job)

    def work(self, handler, concurrency=4, lease=30, drain=False, shutdown_grace=30):
        """Run ``handler(job)`` for every job, ``concurrency`` at a time, on
        the crate's worker loop (batched claims and outcomes, one renewal
        round for all held jobs). Returning completes the job (a returned
        value is kept as its result); raising fails it with the exception's
        text. With ``drain`` it returns once nothing is ready, running or
        due; else until Ctrl-C, which stops it gracefully and is raised.
        Returns ``{"completed", "failed", "abandoned", "lost"}``."""

        def call(native_job):
            return handler(Job(native_job))

        return self._native.work(
            call, int(concurrency), float(lease), bool(drain), float(shutdown_grace)
        )

    def stats(self):
        """Jobs per state: ready, scheduled, running, done, dead, cancelled, waiting."""
        return self._native.stats()

    def get(self, job_id):
        """One job, as ``leasehold queue get`` prints it."""
        return self._native.get(int(job_id))

    def cancel(self, job_id):
        """Cancel a job; returns its state."""
        return self._native.cancel(int(job_id))

    def pause(self):
        """Pause the queue, durably and fleet-wide: no worker starts one of
        its jobs until :meth:`resume`; running jobs finish and pushes are
        accepted. Returns whether it changed anything."""
        return self._native.pause()

    def resume(self):
        """Resume a paused queue (idle workers claim at once). Returns
        whether it changed anything."""
        return self._native.resume()

    @property
    def paused(self):
        """Whether the queue is paused (read from the store)."""
        return self._native.paused

    def set_limits(self, concurrency=None, per_key=None, rate=None, per_key_rate=None):
        """Replace the queue's limits, durably and fleet-wide: at most
        ``concurrency`` of its jobs run at once, and at most ``per_key`` of
        those pushed with one ``key``; at most ``rate`` of its jobs start
        per window, and at most ``per_key_rate`` of one key's. A rate is
        ``"N/DUR"`` as the CLI takes it (``"100/1m"``, ``"1/10s"``) or a
        pair ``(n, seconds)``; it is a sliding window of the store's time.
        ``None``: no limit (``set_limits()`` clears them all). Running jobs
        are never stopped. Returns whether the limits changed."""
        return self._native.set_limits(
            concurrency, per_key, _rate(rate), _rate(per_key_rate)
        )

    @property
    def limits(self):
        """The queue's limits, ``{"concurrency": n, "per_key": m, "rate":
        "N/DUR", "per_key_rate": "N/DUR"}`` (``None`` where unlimited),
        read from the store."""
        concurrency, per_key, rate, per_key_rate = self._native.limits
        return {
            "concurrency": concurrency,
            "per_key": per_key,
            "rate": rate,
            "per_key_rate": per_key_rate,
        }


def _rate(rate):
    """A rate as the native layer takes it: ``"N/DUR"`` (a pair ``(n,
    seconds)`` becomes ``"n/<ms>ms"``)."""
    if rate is None or isinstance(rate, str):
        return rate
    n, seconds = rate
    return f"{int(n)}/{round(float(seconds) * 1000)}ms"


class Store:
    """An open store (:func:`open`)."""

    __slots__ = ("_native",)

    def __init__(self, native):
        self._native = native

    @property
    def url(self):
        return self._native.url

    def lock(self, key, ttl=30, wait=0, label=None, limit=1, keep_alive=True):
        """Acquire ``key`` for ``ttl`` seconds, waiting up to ``wait`` while
        it is held (raises :class:`LeaseHeld` when the wait runs out)."""
        return Lease(
            self._native.lock(key, float(ttl), float(wait), label, int(limit), bool(keep_alive))
        )

    def holders(self, key):
        """The live holders of ``key`` (empty when it is free)."""
        return self._native.holders(key)

    def queue(self, name):
        """The queue ``name``."""
        return Queue(self._native.queue(name))

    def __repr__(self):
        return repr(self._native)


def open(url="sqlite:leasehold.db"):  # noqa: A001 - the package's verb
    """Open a store: ``sqlite:PATH``, ``file:DIR`` (leases only),
    ``postgres://USER@HOST:PORT/DB``, or ``mem:`` (this process only);
    options as URL parameters (``sqlite:x.db?synchronous=full``)."""
    return Store(_native.open(url))
