"""What sherlock and the geo-processing queue got wrong, on real
processes: SIGKILLed holders, two PID 1s, fork, the GIL and Ctrl-C,
bursts of claimers, killed and raising workers."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import leasehold
from helpers import finish, python, wait_for_line

# --- a holder SIGKILLed in the middle of anything --------------------------

HOLDER = """
    import sys, leasehold
    import leasehold.sherlock as sherlock
    url, key, shim = sys.argv[1], sys.argv[2], sys.argv[3] == "shim"
    print("ready", flush=True)
    if shim:
        lock = sherlock.FileLock(key, client=url[len("file:"):], expire=0.5, timeout=30)
        while True:
            lock.acquire(); lock.renew(); lock.locked(); lock.release()
    store = leasehold.open(url)
    while True:
        lease = store.lock(key, ttl=0.5, wait=30)
        lease.renew(); lease.check(); store.holders(key)
        lease.release()
"""


@pytest.mark.parametrize("kind", ["file", "sqlite", "shim"])
def test_a_sigkilled_holder_frees_the_lock_within_its_expiry_every_time(tmp_path, name, kind):
    url = f"sqlite:{tmp_path / 'l.db'}" if kind == "sqlite" else f"file:{tmp_path / 'leases'}"
    if kind != "sqlite":
        (tmp_path / "leases").mkdir()
    store = leasehold.open(url)
    rng = random.Random(7)
    for _ in range(12):
        child = python(HOLDER, url, name, kind)
        wait_for_line(child, "ready")
        time.sleep(rng.uniform(0.02, 0.25))  # somewhere in the loop
        child.send_signal(signal.SIGKILL)
        child.wait()
        started = time.monotonic()
        # Within its expiry (0.5 s) and a margin for this machine.
        with store.lock(name, ttl=5, wait=3):
            pass
        assert time.monotonic() - started < 1.5


# --- two processes that are both PID 1 -------------------------------------

PID1 = """
    import os, sys, time
    import leasehold.sherlock as sherlock
    assert os.getpid() == 1, os.getpid()
    lock = sherlock.FileLock(sys.argv[1], client=sys.argv[2], expire=30)
    got = lock.acquire(False)
    print("pid", os.getpid(), "got", got, flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _unshare():
    exe = shutil.which("unshare")
    if exe is None:
        return None
    probe = subprocess.run([exe, "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return exe if probe.returncode == 0 else None


def test_two_pid_1s_never_both_hold_it(tmp_path, name):
    unshare = _unshare()
    if unshare is None:
        pytest.skip("unshare --pid is not permitted here (needs root or user namespaces)")
    import textwrap

    code = textwrap.dedent(PID1)
    cmd = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, name, tmp_path]
    first = subprocess.Popen([*map(str, cmd), "3"], stdout=subprocess.PIPE, text=True)
    line = first.stdout.readline().split()
    assert line == ["pid", "1", "got", "True"], line
    second = subprocess.run([*map(str, cmd), "0"], capture_output=True, text=True, timeout=30)
    assert second.stdout.split() == ["pid", "1", "got", "False"], second.stderr
    first.wait(timeout=30)


# --- fork -----------------------------------------------------------------


def test_a_forked_child_never_touches_the_parents_lease(sqlite_url, name):
    store = leasehold.open(sqlite_url)
    lease = store.lock(name, ttl=1)  # kept alive by a thread of the parent
    q = store.queue(name)
    q.push(b"x")
    job = q.claim(lease=30)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then _exit (no pytest teardown)
        report = {}
        for what, call in [
            ("release", lease.release),
            ("renew", lease.renew),
            ("complete", job.complete),
            ("push", lambda: q.push(b"y")),
            ("lock", lambda: store.lock(name + "-child", ttl=5)),
        ]:
            try:
                call()
                report[what] = "ok"
            except leasehold.Forked as e:
                report[what] = "Forked: " + str(e)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                report[what] = f"{type(e).__name__}: {e}"
        report["valid"] = lease.valid()
        try:
            own = leasehold.open(sqlite_url)
            with own.lock(name + "-child", ttl=5) as mine:
                report["own"] = mine.token
            report["own_push"] = own.queue(name).push(b"child")
        except Exception as e:  # noqa: BLE001
            report["own"] = f"{type(e).__name__}: {e}"
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child deadlocked")
        time.sleep(0.01)
    report = json.loads(os.read(read, 65536))
    for what in ["release", "renew", "complete", "push", "lock"]:
        assert report[what].startswith("Forked: "), report
        assert "fork" in report[what]
    assert report["valid"] is False
    assert isinstance(report["own"], int), report
    assert isinstance(report["own_push"], int), report
    # The parent keeps its lease (renewed past its 1 s TTL) and its job.
    time.sleep(1.5)
    assert lease.valid()
    [holder] = store.holders(name)
    assert holder["token"] == lease.token
    job.complete()
    lease.release()


def _use_parents_lock(lock, out):
    import leasehold.sherlock as sh

    try:
        lock.release()
        out.put("released")
    except sh.LockException as e:
        out.put("LockException: " + str(e))
    try:
        out.put("renewed" if lock.renew() else "not renewed")
    except sh.LockException as e:
        out.put("LockException: " + str(e))


def test_multiprocessing_fork_child_cannot_release_the_parents_lock(tmp_path, name):
    import multiprocessing

    import leasehold.sherlock as sh

    lock = sh.FileLock(name, client=tmp_path, expire=30, keep_alive=True)
    assert lock.acquire()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_use_parents_lock, args=(lock, out))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    answers = [out.get(timeout=5), out.get(timeout=5)]
    assert all(a.startswith("LockException") and "fork" in a for a in answers), answers
    assert sh.FileLock(name, client=tmp_path).acquire(False) is False
    lock.release()


# --- the GIL and Ctrl-C -----------------------------------------------------


def test_blocking_calls_release_the_gil(store_url, name):
    store = leasehold.open(store_url)
    held = store.lock(name, ttl=30)
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        with pytest.raises(leasehold.LeaseHeld):
            store.lock(name, ttl=30, wait=0.5)
        during_lock = len(ticks)
        q = store.queue(name)
        q.push(b"x")

        def slow(job):
            time.sleep(0.3)

        before = len(ticks)
        q.work(slow, concurrency=1, lease=10, drain=True)
        during_work = len(ticks) - before
    finally:
        stop.set()
        counter.join()
    assert during_lock > 100, during_lock  # about 500 if the wait never held the GIL
    assert during_work > 50, during_work
    held.release()


WAITER = """
    import signal, sys, time, leasehold
    # What an interactive Python has; a process started in the background
    # by a shell without job control (as a CI runner may be) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    store = leasehold.open(sys.argv[1])
    what = sys.argv[3]
    print("waiting", flush=True)
    try:
        if what == "lock":
            store.lock(sys.argv[2], ttl=5, wait=60)
        else:
            store.queue(sys.argv[2]).work(lambda job: None, concurrency=2, lease=5)
    except KeyboardInterrupt:
        print("interrupted", time.monotonic(), flush=True)
"""


@pytest.mark.parametrize("what", ["lock", "work"])
def test_ctrl_c_interrupts_a_blocking_wait_within_about_100ms(sqlite_url, name, what):
    store = leasehold.open(sqlite_url)
    held = store.lock(name, ttl=60)
    child = python(WAITER, sqlite_url, name, what)
    wait_for_line(child, "waiting")
    time.sleep(0.5)  # well inside the wait
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = finish(child, timeout=30)
    word, at = out.split()[-2:]
    assert word == "interrupted"
    assert float(at) - sent < 0.3, float(at) - sent
    held.release()


# --- the geo-processing server's races -------------------------------------

CLAIMER = """
    import json, sys, time, leasehold
    url, queue, start, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    q = leasehold.open(url).queue(queue)
    claims = []
    time.sleep(max(0.0, start - time.time()))  # all 8 at the same instant
    if mode == "claim":
        while True:
            job = q.claim(lease=60)
            if job is None:
                break
            claims.append([job.id, job.token, job.attempt])
            job.complete()
    else:
        def handler(job):
            claims.append([job.id, job.token, job.attempt])
        q.work(handler, concurrency=4, lease=60, drain=True)
    print(json.dumps(claims))
"""


@pytest.mark.parametrize("mode", ["claim", "work"])
def test_a_burst_of_8_processes_never_claims_a_job_twice(store_url, name, mode):
    q = leasehold.open(store_url).queue(name)
    ids = {q.push({"tile": i}) for i in range(400)}
    start = time.time() + 1.5
    children = [python(CLAIMER, store_url, name, start, mode) for _ in range(8)]
    claims = []
    for child in children:
        out, _ = finish(child, timeout=120)
        claims.extend(json.loads(out.strip().splitlines()[-1]))
    claimed = [c[0] for c in claims]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) == ids
    assert all(c[2] == 1 for c in claims)
    assert q.stats()["done"] == 400 and q.stats()["running"] == 0


KILLED_WORKER = """
    import sys, time, leasehold
    q = leasehold.open(sys.argv[1]).queue(sys.argv[2])
    def handler(job):
        print("started", job.id, job.attempt, flush=True)
        time.sleep(600)
    q.work(handler, concurrency=1, lease=1)
"""


def test_a_sigkilled_worker_leaves_nothing_stuck_running(store_url, name):
    q = leasehold.open(store_url).queue(name)
    jid = q.push(b"request")
    child = python(KILLED_WORKER, store_url, name)
    line = child.stdout.readline().split()
    assert line == ["started", str(jid), "1"], (line, child.stderr.read() if not line else "")
    child.send_signal(signal.SIGKILL)
    child.wait()
    killed = time.monotonic()
    assert q.get(jid)["state"] == "running"
    deadline = killed + 10
    job = None
    while job is None and time.monotonic() < deadline:
        job = q.claim(lease=30)
        time.sleep(0.05)
    assert job is not None, q.get(jid)
    # Claimed again after its 1 s lease (and not long after).
    assert time.monotonic() - killed < 4
    assert (job.id, job.attempt) == (jid, 2)
    job.complete()
    assert q.stats()["running"] == 0 and q.get(jid)["state"] == "done"


RAISING_WORKER = """
    import json, sys, leasehold
    q = leasehold.open(sys.argv[1]).queue(sys.argv[2])
    attempts = []
    def handler(job):
        attempts.append(job.attempt)
        raise ValueError(f"bad tile on attempt {job.attempt}")
    report = q.work(handler, concurrency=2, lease=10, drain=True)
    print(json.dumps({"report": report, "attempts": attempts}))
"""


def test_a_raising_handlers_job_is_retried_and_ends_dead_with_its_last_error(store_url, name):
    q = leasehold.open(store_url).queue(name)
    jid = q.push(b"tile", max_attempts=3)
    out, _ = finish(python(RAISING_WORKER, store_url, name), timeout=120)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["attempts"] == [1, 2, 3]
    assert got["report"]["failed"] == 3
    job = q.get(jid)
    assert job["state"] == "dead" and job["attempts"] == 3
    assert job["last_error"] == "ValueError: bad tile on attempt 3"


# --- import cost ---------------------------------------------------------------

RSS = """
    def rss_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    before = rss_kib()
    import leasehold, leasehold.sherlock
    print(rss_kib() - before)
"""


def test_importing_adds_at_most_10_mb_of_rss():
    out, _ = finish(python(RSS))
    added_kib = int(out.strip())
    assert added_kib <= 10 * 1024, f"import added {added_kib} KiB"
