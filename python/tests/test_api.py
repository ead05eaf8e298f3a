"""The native API: leases, the queue, errors that name their cause."""

import threading
import time

import pytest

import leasehold


def test_lock_gives_a_token_and_the_with_block_releases(store_url, name):
    store = leasehold.open(store_url)
    with store.lock(name, ttl=30, wait=1, label="tap-x") as lease:
        assert isinstance(lease.token, int) and lease.token >= 1
        assert lease.key == name
        assert lease.valid()
        assert 29 < lease.remaining() <= 30
        lease.check()
        [holder] = store.holders(name)
        assert holder["label"] == "tap-x"
        assert holder["token"] == lease.token
        first = lease.token
    assert store.holders(name) == []
    assert not lease.valid()
    with pytest.raises(leasehold.LeaseLost):
        lease.check()
    with store.lock(name, ttl=30) as again:
        assert again.token > first


def test_a_held_key_raises_lease_held_after_the_wait(store_url, name):
    store = leasehold.open(store_url)
    lease = store.lock(name, ttl=30)
    started = time.monotonic()
    with pytest.raises(leasehold.LeaseHeld) as held:
        store.lock(name, ttl=30, wait=0.3)
    waited = time.monotonic() - started
    assert 0.25 <= waited < 3, waited
    assert name in str(held.value)
    assert isinstance(held.value, leasehold.Error)
    lease.release()
    lease.release()  # a second release does nothing
    store.lock(name, ttl=30).release()


def test_a_waiter_gets_the_key_when_it_is_released(store_url, name):
    store = leasehold.open(store_url)
    lease = store.lock(name, ttl=30)
    threading.Timer(0.3, lease.release).start()
    started = time.monotonic()
    with store.lock(name, ttl=30, wait=10) as second:
        assert second.token > lease.token
    assert time.monotonic() - started < 5


def test_keep_alive_holds_past_the_ttl_and_without_it_the_lease_is_lost(store_url, name):
    store = leasehold.open(store_url)
    kept = store.lock(name + "-kept", ttl=0.6)
    bare = store.lock(name + "-bare", ttl=0.6, keep_alive=False)
    time.sleep(1.5)
    assert kept.valid()
    kept.check()
    assert not bare.valid()
    assert bare.remaining() == 0.0
    with pytest.raises(leasehold.LeaseLost):
        bare.check()
    # Someone else may take the expired one; the kept one is still held.
    store.lock(name + "-bare", ttl=5).release()
    with pytest.raises(leasehold.LeaseHeld):
        store.lock(name + "-kept", ttl=5)
    kept.release()


def test_renew_extends_and_raises_once_lost(store_url, name):
    store = leasehold.open(store_url)
    lease = store.lock(name, ttl=0.5, keep_alive=False)
    time.sleep(0.3)
    lease.renew()
    assert lease.remaining() > 0.35
    time.sleep(0.8)
    store.lock(name, ttl=30).release()  # the key changed hands
    with pytest.raises(leasehold.LeaseLost):
        lease.renew()


def test_a_counting_lease_admits_limit_holders(store_url, name):
    store = leasehold.open(store_url)
    a = store.lock(name, ttl=30, limit=2)
    b = store.lock(name, ttl=30, limit=2)
    with pytest.raises(leasehold.LeaseHeld):
        store.lock(name, ttl=30, limit=2)
    assert len(store.holders(name)) == 2
    a.release()
    b.release()


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"ttl": float("nan")}, "ttl"),
        ({"ttl": 5, "wait": -1}, "wait"),
        ({"ttl": 5, "limit": 0}, "limit"),
    ],
)
def test_bad_lock_arguments_are_named(sqlite_url, name, kwargs, names):
    store = leasehold.open(sqlite_url)
    with pytest.raises(ValueError) as bad:
        store.lock(name, **kwargs)
    assert isinstance(bad.value, leasehold.InvalidInput)
    assert names in str(bad.value)
    assert store.holders(name) == []


def test_a_bad_key_is_named(sqlite_url):
    store = leasehold.open(sqlite_url)
    with pytest.raises(leasehold.InvalidInput) as bad:
        store.lock("", ttl=5)
    assert "key" in str(bad.value)
    with pytest.raises(leasehold.InvalidInput):
        store.lock("x" * 100_000, ttl=5)


@pytest.mark.parametrize(
    "url, names",
    [
        ("bogus:x", "bogus"),
        ("sqlite:", "path"),
        ("postgres://", "postgres"),
        ("sqlite:/nonexistent-dir/x/y.db", "/nonexistent-dir"),
    ],
)
def test_a_bad_store_url_is_named(url, names):
    with pytest.raises(leasehold.Error) as bad:
        leasehold.open(url)
    assert names in str(bad.value)


def test_file_store_leases(tmp_path, name):
    store = leasehold.open(f"file:{tmp_path / 'leases'}")
    with store.lock(name, ttl=30) as lease:
        with pytest.raises(leasehold.LeaseHeld):
            store.lock(name, ttl=30)
        assert lease.valid()
    with pytest.raises(leasehold.Error):
        store.queue("q").push(b"x")


def test_push_claim_complete_and_get(store_url, name):
    q = leasehold.open(store_url).queue(name)
    a = q.push(b"\x00\xffraw")
    b = q.push("text")
    c = q.push({"json": 1}, priority=5)
    assert a < b < c
    assert q.stats() == {"ready": 3, "scheduled": 0, "running": 0, "done": 0, "dead": 0, "cancelled": 0, "waiting": 0}
    job = q.claim(lease=30)
    assert (job.id, job.attempt) == (c, 1)  # the highest priority first
    assert job.json() == {"json": 1}
    assert isinstance(job.token, int) and job.valid()
    assert q.stats()["running"] == 1
    job.complete(result={"ok": True})
    with pytest.raises(leasehold.LeaseLost):
        job.complete()
    got = q.get(c)
    assert got["state"] == "done" and got["result"] == '{"ok": true}'
    assert got["attempts"] == 1 and got["queue"] == name
    raw = q.claim()
    assert raw.payload == b"\x00\xffraw"
    raw.complete()
    assert q.get(a)["payload_encoding"] == "base64"
    text = q.claim()
    assert text.text() == "text"
    assert text.fail("boom") == "scheduled"
    assert q.get(b)["last_error"] == "boom"
    assert q.claim() is None


def test_push_many_is_one_batch_in_order_all_or_nothing(store_url, name):
    q = leasehold.open(store_url).queue(name)
    assert q.push_many([]) == []
    with pytest.raises(TypeError, match="list of payloads"):
        q.push_many(b"abc")
    ids = q.push_many([b"a", "b", {"c": 3}], priority=2, max_attempts=1)
    assert len(ids) == 3 and ids[0] < ids[1] < ids[2]
    assert [q.claim().payload for _ in ids] == [b"a", b"b", b'{"c": 3}']
    assert q.get(ids[0])["priority"] == 2 and q.get(ids[0])["max_attempts"] == 1
    later = q.push_many([b"x", b"y"], delay=60)
    assert q.stats()["scheduled"] == 2 and later[0] < later[1]
    before = q.stats()
    with pytest.raises(leasehold.InvalidInput, match="more than 10000"):
        q.push_many([b"ok"] * 10_001)
    with pytest.raises(leasehold.InvalidInput, match="job 0 of the batch"):
        q.push_many([b"ok", b"orphan"], after=[10**12])
    with pytest.raises(leasehold.InvalidInput, match="2 unique keys for 3 payloads"):
        q.push_many([b"1", b"2", b"3"], unique=["a", "b"])
    assert q.stats() == before
    # Per-job unique and concurrency keys: a key repeated in the list, or
    # held by a live job, answers that job's id.
    first = q.push(b"u", unique="u1")
    ids = q.push_many([b"p", b"q", b"r", b"s"], unique=["u1", "u2", None, "u2"],
                      key=["k1", "k2", "k3", "k4"])
    assert ids[0] == first and ids[3] == ids[1] and len(set(ids)) == 3
    again = q.push_many_unique([b"t", b"v"], unique=["u2", "u3"])
    assert again[0] == (ids[1], False) and again[1][1] is True
    assert q.get(ids[1])["key"] == "k2" and q.get(ids[2])["key"] == "k3"


def test_delay_max_attempts_unique_and_cancel(store_url, name):
    q = leasehold.open(store_url).queue(name)
    later = q.push(b"later", delay=60)
    assert q.stats()["scheduled"] == 1
    assert q.claim() is None
    once = q.push(b"once", max_attempts=1)
    job = q.claim()
    assert job.id == once
    assert job.fail("no") == "dead"
    assert q.get(once)["state"] == "dead"
    u1 = q.push(b"u", unique="same")
    u2 = q.push(b"u", unique="same")
    assert u1 == u2
    assert q.cancel(later) == "cancelled"
    assert q.get(later)["state"] == "cancelled"
    with pytest.raises(leasehold.NotFound):
        q.get(10**12)
    with pytest.raises(leasehold.InvalidInput):
        q.push(b"x", delay=-1)
    with pytest.raises(leasehold.InvalidInput):
        q.claim(lease=0)


def test_pause_holds_claims_and_resume_lets_them_go(store_url, name):
    store = leasehold.open(store_url)
    q = store.queue(name)
    first = q.push(b"a")
    assert q.paused is False
    assert q.pause() is True
    assert q.pause() is False
    # Another handle on the same store sees it: the pause is stored.
    other = leasehold.open(store_url).queue(name)
    assert other.paused is True
    second = q.push(b"b")
    assert other.claim() is None
    assert q.stats()["ready"] == 2
    assert q.resume() is True and q.resume() is False
    assert other.paused is False
    assert [other.claim().id, other.claim().id] == [first, second]
    with pytest.raises(leasehold.InvalidInput):
        store.queue("")


def test_limits_hold_one_job_per_key_and_a_queue_wide_cap(store_url, name):
    store = leasehold.open(store_url)
    q = store.queue(name)
    none = {"concurrency": None, "per_key": None, "rate": None, "per_key_rate": None}
    assert q.limits == none
    assert q.set_limits(concurrency=2, per_key=1) is True
    assert q.set_limits(concurrency=2, per_key=1) is False
    other = leasehold.open(store_url).queue(name)
    assert other.limits == {**none, "concurrency": 2, "per_key": 1}
    a1 = q.push(b"a1", key="customer-a")
    a2 = q.push(b"a2", key="customer-a")
    b1 = q.push(b"b1", key="customer-b")
    q.push(b"free")
    first = other.claim(keep_alive=False)
    second = other.claim(keep_alive=False)
    assert [first.id, second.id] == [a1, b1], "a2 waits for a1's slot"
    assert other.claim(keep_alive=False) is None, "two run: the queue is full"
    assert q.get(a2)["key"] == "customer-a"
    assert q.get(a2)["parked"] is True
    first.complete()
    third = other.claim(keep_alive=False)
    assert third.id == a2, "a1's slot goes to a2"
    assert q.set_limits() is True
    assert q.limits == none
    assert other.claim(keep_alive=False).payload == b"free"
    with pytest.raises(leasehold.InvalidInput):
        q.set_limits(concurrency=0)
    with pytest.raises(leasehold.InvalidInput):
        q.push(b"x", key="")


def test_rates_start_no_more_per_window_and_wake_the_worker(store_url, name):
    import time

    q = leasehold.open(store_url).queue(name)
    assert q.set_limits(rate="2/1s", per_key_rate=(1, 0.5)) is True
    assert q.limits["rate"] == "2/1s"
    assert q.limits["per_key_rate"] == "1/500ms"
    first = q.push(b"a1", key="a")
    second = q.push(b"a2", key="a")
    third = q.push(b"u")
    held = [q.claim(keep_alive=False), q.claim(keep_alive=False)]
    assert [j.id for j in held] == [first, third], "a is out of allowance"
    assert q.claim(keep_alive=False) is None, "the queue's two this second"
    for job in held:
        job.complete()
    started = []
    begun = time.monotonic()

    def handler(job):
        started.append((job.id, time.monotonic() - begun))

    report = q.work(handler, drain=True)
    assert report["completed"] == 1
    assert [i for i, _ in started] == [second]
    assert started[0][1] < 5, "woke at the allowance, not at a poll"
    for bad in ["0/1s", "5", "1/1y", (0, 1)]:
        with pytest.raises(leasehold.InvalidInput):
            q.set_limits(rate=bad)
    with pytest.raises(leasehold.InvalidInput) as e:
        q.set_limits(per_key_rate="1001/1s")
    assert "per_key_rate" in str(e.value)
    assert q.limits["rate"] == "2/1s", "a refused change changes nothing"


def test_unique_pushes_by_period_and_state(store_url, name):
    q = leasehold.open(store_url).queue(name)
    first, created = q.push_unique(b"x", unique="daily", unique_for=3600)
    assert created is True
    job = q.claim(keep_alive=False)
    assert job.id == first
    job.complete()
    assert q.push_unique(b"x", unique="daily", unique_for=3600) == (first, False)
    assert q.push(b"x", unique="daily") != first, "by default a done job blocks nothing"
    waiting = q.push(b"w", unique="sync", unique_states=["ready", "scheduled"])
    assert q.push_unique(b"w", unique="sync", unique_states="ready") == (waiting, False)
    with pytest.raises(leasehold.InvalidInput) as e:
        q.push(b"x", unique="k", unique_states="ready,finished")
    assert "unique_states" in str(e.value)
    with pytest.raises(leasehold.InvalidInput):
        q.push(b"x", unique_for=60)


def test_a_job_past_its_timeout_fails_saying_so(store_url, name):
    import time

    q = leasehold.open(store_url).queue(name)
    jid = q.push(b"slow", timeout=0.3, max_attempts=1)
    assert q.get(jid)["timeout_ms"] == 300
    seen = []

    def handler(job):
        deadline = time.monotonic() + 3
        while job.valid() and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(job.valid())

    q.work(handler, concurrency=1, lease=30, drain=True)
    assert seen == [False], "the handler saw its job stop being valid"
    job = q.get(jid)
    assert job["state"] == "dead"
    assert "timed out" in job["last_error"]
    with pytest.raises(leasehold.InvalidInput):
        q.push(b"x", timeout=0)


def test_abandon_gives_the_job_back(store_url, name):
    q = leasehold.open(store_url).queue(name)
    jid = q.push(b"x")
    job = q.claim()
    assert job.abandon() == "ready"
    again = q.claim()
    assert again.id == jid and again.token > job.token
    again.complete()


def test_work_runs_every_job_and_reports(store_url, name):
    q = leasehold.open(store_url).queue(name)
    ids = [q.push({"i": i}) for i in range(50)]
    seen = []
    lock = threading.Lock()

    def handler(job):
        with lock:
            seen.append(job.json()["i"])
        if job.json()["i"] == 7:
            raise RuntimeError("seven is bad")
        return {"double": job.json()["i"] * 2}

    report = q.work(handler, concurrency=4, lease=10, drain=True)
    # 7 fails each attempt (3 by default) and ends dead.
    assert report == {"completed": 49, "failed": 3, "abandoned": 0, "lost": 0}
    assert sorted(set(seen)) == list(range(50))
    assert q.stats()["done"] == 49 and q.stats()["dead"] == 1
    assert q.get(ids[42])["result"] == '{"double": 84}'
    dead = q.get(ids[7])
    assert dead["state"] == "dead" and dead["attempts"] == 3
    assert dead["last_error"] == "RuntimeError: seven is bad"


def test_a_work_handler_settles_by_returning_not_by_hand(store_url, name):
    q = leasehold.open(store_url).queue(name)
    q.push(b"x")
    kept = []

    def handler(job):
        kept.append(job)
        with pytest.raises(leasehold.InvalidInput):
            job.complete()
        assert job.valid()

    assert q.work(handler, concurrency=1, lease=10, drain=True)["completed"] == 1
    # The handle is inert after its handler returned.
    assert not kept[0].valid()


def test_a_handlers_progress_is_kept_with_its_job(store_url, name):
    q = leasehold.open(store_url).queue(name)
    jid = q.push(b"x")
    kept = []

    def handler(job):
        job.progress(0.25, "a quarter")
        with pytest.raises(leasehold.InvalidInput):
            job.progress(2, "more than all")
        job.progress(1.0, "all tiles")
        kept.append(job)

    assert q.work(handler, concurrency=1, lease=10, drain=True)["completed"] == 1
    assert q.get(jid)["progress"] == {"fraction": 1.0, "message": "all tiles"}
    with pytest.raises(leasehold.InvalidInput):
        kept[0].progress(0.5)  # its handler returned
    # By hand: sent with the settle.
    jid = q.push(b"y")
    job = q.claim()
    job.progress(0.5, "half")
    job.complete()
    assert q.get(jid)["progress"]["message"] == "half"


def test_a_job_pushed_after_others_waits_for_them(store_url, name):
    q = leasehold.open(store_url).queue(name)
    a = q.push(b"a")
    b = q.push(b"b")
    c = q.push(b"c", after=[a, b])
    assert q.get(c)["state"] == "waiting" and q.get(c)["after"] == [a, b]
    assert q.stats()["waiting"] == 1
    for _ in range(2):
        q.claim().complete()
    assert q.get(c)["state"] == "ready"
    with pytest.raises(leasehold.InvalidInput):
        q.push(b"x", after=[987654321])


def test_releasing_a_lost_lease_says_so(store_url, name):
    store = leasehold.open(store_url)
    lease = store.lock(name, ttl=0.3, keep_alive=False)
    time.sleep(0.6)
    store.lock(name, ttl=30).release()  # someone else had it meanwhile
    with pytest.raises(leasehold.LeaseLost):
        lease.renew()  # the loss, observed
    with pytest.raises(leasehold.LeaseLost):
        lease.release()
    lease.release()  # a second call does nothing


def test_check_names_the_reason_the_lease_was_lost(store_url, name):
    store = leasehold.open(store_url)
    lease = store.lock(name, ttl=0.3, keep_alive=False)
    time.sleep(0.6)
    store.lock(name, ttl=30).release()
    with pytest.raises(leasehold.LeaseLost):
        lease.renew()  # refused: another grant came since
    with pytest.raises(leasehold.LeaseLost) as lost:
        lease.check()
    assert "stale token" in str(lost.value), str(lost.value)
