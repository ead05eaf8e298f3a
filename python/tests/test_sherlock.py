"""leasehold.sherlock behaves as sherlock's public API does: every
semantic of the issue's list is a test, run on leasehold.sherlock and,
when the real ``sherlock`` (with ``filelock``) is installed, on it too, so
the list is checked against the library it replaces. What sherlock gets
wrong is in test_processes.py."""

import gc
import importlib
import time

import pytest

import leasehold
import leasehold.sherlock

IMPLS = ["leasehold"]
try:  # the library replaced: the reference of every semantic here
    importlib.import_module("sherlock")
    importlib.import_module("filelock")
    IMPLS.append("sherlock")
except ImportError:
    pass


@pytest.fixture(params=IMPLS)
def sherlock(request):
    if request.param == "leasehold":
        return leasehold.sherlock
    return importlib.import_module("sherlock")


@pytest.fixture
def make(sherlock, tmp_path, name):
    """A FileLock of the implementation under test, in its own directory."""

    def make(lock_name=name, **kwargs):
        kwargs.setdefault("client", tmp_path / "locks")
        return sherlock.FileLock(lock_name, **kwargs)

    return make


def test_acquire_returns_true_and_release_none(make):
    lock = make()
    assert lock.acquire() is True
    assert lock.locked() is True
    assert lock.release() is None
    assert lock.locked() is False


def test_blocking_acquire_times_out_after_about_timeout(sherlock, make):
    holder = make(expire=30)
    assert holder.acquire()
    other = make(timeout=0.5, retry_interval=0.1)
    started = time.monotonic()
    with pytest.raises(sherlock.LockTimeoutException):
        other.acquire()
    assert 0.3 <= time.monotonic() - started < 3
    holder.release()


def test_blocking_acquire_gets_it_once_it_expires(make):
    holder = make(expire=0.5)
    assert holder.acquire()
    other = make(timeout=5, retry_interval=0.1)
    started = time.monotonic()
    assert other.acquire() is True
    assert 0.3 <= time.monotonic() - started < 3
    other.release()


def test_non_blocking_acquire_returns_a_bool(make):
    holder = make()
    other = make()
    assert holder.acquire(False) is True
    assert other.acquire(False) is False
    assert other.acquire(blocking=False) is False
    holder.release()
    assert other.acquire(False) is True
    other.release()


def test_not_reentrant(make):
    lock = make(timeout=0.2)
    assert lock.acquire(False) is True
    assert lock.acquire(False) is False


def test_not_reentrant_blocking_times_out(sherlock, make):
    lock = make(timeout=0.3)
    assert lock.acquire() is True
    with pytest.raises(sherlock.LockTimeoutException):
        lock.acquire()


def test_release_before_any_acquire_raises(sherlock, make):
    lock = make()
    with pytest.raises(sherlock.LockException) as e:
        lock.release()
    assert str(e.value) == "Lock was not set by this process."


def test_release_after_a_failed_acquire_raises(sherlock, make):
    holder = make()
    other = make()
    holder.acquire()
    assert other.acquire(False) is False
    with pytest.raises(sherlock.LockException):
        other.release()
    assert holder.locked()


def test_release_is_silent_when_it_expired_and_someone_else_holds_it(make):
    first = make(expire=0.3)
    assert first.acquire()
    time.sleep(0.6)
    second = make(expire=30)
    assert second.acquire(False) is True
    assert first.release() is None
    assert second.locked() is True  # the other holder keeps it
    second.release()


def test_release_twice_is_silent(make):
    lock = make()
    lock.acquire()
    lock.release()
    assert lock.release() is None


def test_renew_returns_true_while_held(make):
    lock = make(expire=0.6)
    lock.acquire()
    for _ in range(4):
        time.sleep(0.3)
        assert lock.renew() is True
    assert lock.locked()
    lock.release()


def test_renew_returns_false_once_expired(make):
    lock = make(expire=0.3)
    lock.acquire()
    time.sleep(0.6)
    assert lock.renew() is False


def test_renew_returns_false_once_taken(make):
    lock = make(expire=0.3)
    lock.acquire()
    time.sleep(0.6)
    other = make(expire=30)
    assert other.acquire(False)
    assert lock.renew() is False
    other.release()


def test_renew_returns_false_after_release(make):
    lock = make()
    lock.acquire()
    lock.release()
    assert lock.renew() is False


def test_renew_before_any_acquire_raises(sherlock, make):
    with pytest.raises(sherlock.LockException) as e:
        make().renew()
    assert str(e.value) == "Lock was not set by this process."


def test_locked_is_true_when_anyone_holds_it(make):
    holder = make()
    watcher = make()
    assert watcher.locked() is False
    holder.acquire()
    assert watcher.locked() is True
    holder.release()
    assert watcher.locked() is False


def test_locked_is_false_once_expired(make):
    holder = make(expire=0.3)
    holder.acquire()
    time.sleep(0.6)
    assert make().locked() is False


def test_expire_none_never_expires(make):
    holder = make(expire=None)
    assert holder.acquire()
    time.sleep(0.5)
    assert make().acquire(False) is False
    assert holder.renew() is True
    holder.release()


def test_context_manager_acquires_and_releases(make):
    with make() as lock:
        assert lock.locked()
        assert make().acquire(False) is False
    assert make().locked() is False


def test_context_manager_raises_timeout_when_held(sherlock, make):
    holder = make()
    holder.acquire()
    with pytest.raises(sherlock.LockTimeoutException):
        with make(timeout=0.2):
            pass


def test_collected_lock_is_released(make):
    lock = make()
    lock.acquire()
    del lock
    gc.collect()
    assert make().acquire(False) is True


def test_namespace_makes_the_key(make, tmp_path, name):
    a = make(name, namespace="ns")
    a.acquire()
    # Another namespace or none is another lock.
    assert make(name).acquire(False) is True
    assert make(name, namespace="other").acquire(False) is True
    assert make(name, namespace="ns").acquire(False) is False


def test_configure_sets_the_defaults(sherlock, make):
    saved = (sherlock._configuration.expire, sherlock._configuration.timeout)
    try:
        sherlock.configure(expire=0.3, timeout=0.2)
        lock = make()
        assert (lock.expire, lock.timeout) == (0.3, 0.2)
        assert lock.acquire()
        with pytest.raises(sherlock.LockTimeoutException):
            make().acquire()
        time.sleep(0.5)
        assert make().acquire(False)  # it expired after the configured 0.3 s
    finally:
        sherlock.configure(expire=saved[0], timeout=saved[1])


def test_sherlocks_defaults(sherlock, make):
    lock = make()
    assert (lock.expire, lock.timeout, lock.retry_interval) == (60, 10, 0.1)
    assert lock.namespace is None


def test_exception_classes(sherlock):
    assert issubclass(sherlock.LockException, Exception)
    assert issubclass(sherlock.LockTimeoutException, Exception)


# On top of sherlock, without breaking it.


def test_lock_on_the_configured_store(sqlite_url, name):
    sh = leasehold.sherlock
    sh.configure(store=sqlite_url)
    try:
        a = sh.Lock(name, expire=30)
        assert a.acquire(False)
        assert sh.Lock(name).acquire(False) is False
        assert a.token >= 1
        a.release()
    finally:
        sh.configure(store=None)


def test_lock_without_a_store_says_so(name):
    with pytest.raises(leasehold.sherlock.LockException) as e:
        leasehold.sherlock.Lock(name).acquire(False)
    assert "configure(store=URL)" in str(e.value)


def test_tokens_grow_with_every_grant(tmp_path, name):
    sh = leasehold.sherlock
    tokens = []
    for _ in range(3):
        lock = sh.FileLock(name, client=tmp_path)
        lock.acquire()
        tokens.append(lock.token)
        lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_keep_alive_holds_it_past_expire(tmp_path, name):
    sh = leasehold.sherlock
    lock = sh.FileLock(name, client=tmp_path, expire=0.5, keep_alive=True)
    lock.acquire()
    time.sleep(1.5)
    assert sh.FileLock(name, client=tmp_path).acquire(False) is False
    assert lock.renew() is True
    lock.release()
    assert sh.FileLock(name, client=tmp_path).acquire(False) is True


def test_configure_rejects_an_unknown_setting():
    with pytest.raises(ValueError) as e:
        leasehold.sherlock.configure(expiry=3)
    assert "expiry" in str(e.value)


def test_a_file_lock_without_sync_is_still_exclusive(tmp_path, name):
    sh = leasehold.sherlock
    fast = sh.FileLock(name, client=tmp_path, durable=False)
    assert fast.acquire(False)
    assert sh.FileLock(name, client=tmp_path, durable=False).acquire(False) is False
    assert sh.FileLock(name, client=tmp_path).acquire(False) is False
    fast.release()
    assert sh.FileLock(name, client=tmp_path).acquire(False) is True
