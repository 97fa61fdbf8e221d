"""cluster.broker._fsync (a group commit's syncs on a thread without the GIL) and
the group-commit rounds that use it, with real files and real failures."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import time

import pytest
import trio
import trio.testing

from cluster.broker.durability import Durability, DurabilityError
from storage.log import PartitionLog
from tests.storage.helpers import entries


def _module():
    from cluster.broker import _fsync

    return _fsync


def test_the_extension_is_built_and_used():
    """Every install with a C compiler builds it (pyproject ext-modules); a
    build that silently fell back to fsyncing on the event loop must fail CI."""
    from cluster.broker import durability

    assert durability._fsync is _module()


def _run(fds, sends=(), added=()):
    """Start a job, wait for its eventfd (at most 10 s), return its result
    (with ``sends``: its result and what each send took). ``added``: sends
    handed to the job after it started (``add_send``), before its thread
    takes it up."""
    fsync = _module()
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        with held_worker():
            job = fsync.start(fds, wake, sends)
            assert all(fsync.add_send(job, send) for send in added)
        readable, _, _ = select.select([wake], [], [], 10)
        assert readable, "the fsync thread never signalled"
        assert os.eventfd_read(wake) == 1
        return (fsync.result(job), fsync.sent(job)) if sends or added else fsync.result(job)
    finally:
        os.close(wake)


@contextlib.contextmanager
def held_worker():
    """The fsync thread takes no new job until the block ends (the C
    module's test hook), so a test acts on a started job first."""
    fsync = _module()
    fsync.hold_worker(True)
    try:
        yield fsync
    finally:
        fsync.hold_worker(False)


def test_syncs_files_and_a_directory(tmp_path):
    paths = [tmp_path / "a", tmp_path / "b"]
    fds = [os.open(p, os.O_CREAT | os.O_WRONLY) for p in paths]
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for fd in fds:
            os.write(fd, b"x" * 4096)
        assert _run([fds[0], ~dir_fd, fds[1]]) is None
        assert _run([]) is None
    finally:
        for fd in (*fds, dir_fd):
            os.close(fd)


def test_reports_the_first_descriptor_that_fails(tmp_path):
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    r, w = os.pipe()  # pipes cannot be synced: EINVAL
    try:
        assert _run([good, r, w]) == (r, errno.EINVAL)
        assert _run([~w]) == (w, errno.EINVAL)  # a full fsync reports the plain fd
    finally:
        for fd in (good, r, w):
            os.close(fd)


def test_many_descriptors_are_synced_at_once_and_the_first_failure_reported(tmp_path):
    """Three or more descriptors are shared with helper threads; whichever
    finishes first, the failure reported is the first by position, and the
    helpers are ready for the next job each time."""
    files = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY) for i in range(12)]
    pipes = [os.pipe() for _ in range(2)]
    try:
        for _ in range(50):
            for fd in files:
                os.write(fd, b"x" * 512)
            assert _run(files) is None
        bad = list(files)
        bad[3] = pipes[0][0]
        bad[9] = pipes[1][0]
        for _ in range(20):
            assert _run(bad) == (pipes[0][0], errno.EINVAL)
        bad[3] = files[3]
        assert _run(bad) == (pipes[1][0], errno.EINVAL)
        assert _run(files[:3] + [~pipes[0][1]]) == (pipes[0][1], errno.EINVAL)
    finally:
        for fd in files:
            os.close(fd)
        for r, w in pipes:
            os.close(r)
            os.close(w)


def test_every_failed_sync_of_a_job_is_reported(tmp_path):
    """The kernel reports a failed writeback to one fsync only, so the caller
    must learn of every descriptor whose sync failed: all of them when the
    syncs ran at once, the first when one after the other stopped there (the
    rest were not tried)."""
    fsync = _module()
    files = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY) for i in range(4)]
    pipes = [os.pipe() for _ in range(2)]
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def failures(fds):
        job = fsync.start(fds, wake)
        assert select.select([wake], [], [], 10)[0], "the fsync thread never signalled"
        os.eventfd_read(wake)
        return fsync.result(job), fsync.failures(job)

    try:
        at_once = [files[0], pipes[0][0], files[1], ~pipes[1][1], files[2]]
        assert failures(at_once) == ((pipes[0][0], errno.EINVAL),
                                     [(pipes[0][0], errno.EINVAL), (pipes[1][1], errno.EINVAL)])
        assert failures([files[0], pipes[0][0], pipes[1][0]][:2]) == (
            (pipes[0][0], errno.EINVAL), [(pipes[0][0], errno.EINVAL)])
        assert failures(files) == (None, [])
    finally:
        os.close(wake)
        for fd in files:
            os.close(fd)
        for r, w in pipes:
            os.close(r)
            os.close(w)


def test_bad_arguments_are_refused():
    fsync = _module()
    with pytest.raises(TypeError):
        fsync.start(["3"], 5)
    with pytest.raises(OverflowError):
        fsync.start([2**40], 5)
    with pytest.raises(TypeError):
        fsync.start(7, 5)


async def test_a_round_fsyncs_a_real_log_off_the_loop(tmp_path):
    log = PartitionLog.open(tmp_path / "p")
    durability = Durability()
    try:
        log.append(entries(1, 10))
        assert log.recovery_point == 0
        seq = durability.note_write(log, "always")
        called = []
        durability.when_durable(seq, lambda error, sent: called.append(error))
        await durability.wait_for_flush(seq)
        assert log.recovery_point == log.log_end_offset == 10
        assert durability.fsync_count == 1
        await trio.testing.wait_all_tasks_blocked()
        assert called == [None]
        durability.when_durable(seq, lambda error, sent: called.append(error))  # already durable: at once
        assert called == [None, None]
    finally:
        durability.close()
        log.close()


async def test_a_round_syncs_a_log_and_a_group_store_together(tmp_path):
    """A round covers every kind of ticket the durability module is handed:
    a partition log's and a consumer group store's (its journal)."""
    from storage.streams.groups import GroupStore

    log = PartitionLog.open(tmp_path / "p")
    store = GroupStore.open(tmp_path / "g")
    durability = Durability()
    try:
        log.append(entries(1, 10))
        store.create_group(b"g", (0, 0), 0)
        durability.note_write(log, "always")
        seq = durability.note_write(store, "always")
        assert store.needs_flush
        await durability.wait_for_flush(seq)
        assert log.recovery_point == 10 and not store.needs_flush
        assert durability.fsync_count == 1
    finally:
        durability.close()
        store.close()
        log.close()


async def _until(condition, timeout_s=10.0):
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.001)


async def test_a_rounds_recovery_point_checkpoint_is_written_after_it_off_the_loop(tmp_path, monkeypatch):
    """The once-a-second checkpoint (a temporary file, fsyncs, a rename) is
    written on a worker thread once the round is done: the round, its
    writers and the next rounds do not wait for it (it only shortens
    recovery); rounds between checkpoints write none."""
    import threading

    import storage.log as storage_log
    from storage.checkpoint import encode_rows

    now = [1_000_000]
    log = PartitionLog.open(tmp_path / "p", clock_ms=lambda: now[0])
    writers = []
    gate = threading.Event()
    real = storage_log.write_atomic

    def held_back(path, data):
        assert gate.wait(10)
        real(path, data)
        writers.append(threading.get_ident())  # once the file is there

    monkeypatch.setattr(storage_log, "write_atomic", held_back)
    rp_file = tmp_path / "p" / storage_log.RECOVERY_POINT_FILE
    before = rp_file.read_bytes() if rp_file.exists() else None
    durability = Durability()
    try:
        async def round_of(first, n):
            log.append(entries(first, n))
            seq = durability.note_write(log, "always")
            called = []
            durability.when_durable(seq, lambda error, sent: called.append(error))
            await durability.wait_for_flush(seq)
            await _until(lambda: called)
            assert called == [None]

        await round_of(1, 10)  # its checkpoint is due, and held back
        await round_of(11, 5)  # the next round does not wait for it
        assert log.recovery_point == 15 and writers == []
        assert (rp_file.read_bytes() if rp_file.exists() else None) == before
        gate.set()
        await _until(lambda: writers)
        assert writers[0] != threading.get_ident()
        assert rp_file.read_bytes() == encode_rows([(10,)])  # what that round's syncs reached
        await round_of(16, 5)  # within the second: no checkpoint
        await trio.sleep(0.05)
        assert len(writers) == 1
        now[0] += storage_log.RECOVERY_CHECKPOINT_INTERVAL_MS
        await round_of(21, 5)
        await _until(lambda: len(writers) == 2)
        assert writers[1] != threading.get_ident()
        assert rp_file.read_bytes() == encode_rows([(25,)]) and log.recovery_point == 25
        assert durability.fsync_count == 4
    finally:
        gate.set()
        durability.close()
        log.close()


class _PipeTicket:
    """A ticket whose descriptor cannot be synced (a pipe: EINVAL)."""

    checkpoints = False

    def __init__(self):
        self.r, self.w = os.pipe()
        self.ok = False

    def sync_targets(self):
        return [(self.r, False)]

    def finish(self, failure):
        os.close(self.r)
        os.close(self.w)
        if failure is not None:
            raise failure
        self.ok = True


class _PipeLog:
    def __init__(self):
        self.ended = []

    def begin_flush(self):
        return _PipeTicket()

    def end_flush(self, ticket):
        self.ended.append(ticket.ok)


async def test_a_failed_sync_is_never_acknowledged():
    durability = Durability()
    log = _PipeLog()
    try:
        first = durability.note_write(log, "always")
        errors = []
        durability.when_durable(first, lambda error, sent: errors.append(error))
        with pytest.raises(DurabilityError, match="Invalid argument"):
            await durability.wait_for_flush(first)
        await trio.testing.wait_all_tasks_blocked()
        assert len(errors) == 1 and isinstance(errors[0], DurabilityError)
        assert log.ended == [False]
        assert durability.last_flush_error
        # Later writes get their own round, which fails again, not silently.
        second = durability.note_write(log, "always")
        with pytest.raises(DurabilityError):
            await durability.wait_for_flush(second)
    finally:
        durability.close()


async def test_a_failed_sync_takes_only_its_own_log_offline(tmp_path, monkeypatch):
    """A round over several logs whose one sync fails: that log refuses
    writes from then on; the round's other logs do not (their writers are
    not acknowledged by that round, and their next round syncs everything
    they hold). Two logs and four: fewer descriptors are synced one after
    the other, three or more at once."""
    from storage.errors import StorageError

    for count in (2, 4):
        logs = [PartitionLog.open(tmp_path / f"{count}-{i}") for i in range(count)]
        bad = logs[1]
        real_begin = bad.begin_flush
        pipe = os.pipe()

        def failing_begin(real_begin=real_begin, pipe=pipe):
            ticket = real_begin()
            real_targets = ticket.sync_targets
            ticket.sync_targets = lambda: [(pipe[0], False), *real_targets()]  # a pipe cannot be synced: EINVAL
            return ticket

        monkeypatch.setattr(bad, "begin_flush", failing_begin)
        durability = Durability()
        try:
            for lg in logs:
                lg.append(entries(1, 3))
                seq = durability.note_write(lg, "always")
            with pytest.raises(DurabilityError, match="Invalid argument"):
                await durability.wait_for_flush(seq)
            monkeypatch.undo()
            with pytest.raises(StorageError, match="offline since an fsync failed"):
                bad.append(entries(10, 1))
            for lg in logs:
                if lg is not bad:
                    lg.append(entries(10, 1))
                    seq = durability.note_write(lg, "always")
            await durability.wait_for_flush(seq)
            assert [lg.recovery_point for lg in logs if lg is not bad] == [4] * (count - 1)
            assert bad.recovery_point == 0
        finally:
            durability.close()
            for lg in logs:
                lg.close()
            os.close(pipe[0])
            os.close(pipe[1])


async def test_everysec_leaves_a_log_offline_after_its_failed_sync_alone(tmp_path, monkeypatch, caplog):
    """Under everysec a log whose sync failed is offline: the failure is
    logged once, and the once-a-second flush does not ask it again (it
    would refuse, every second, until the restart); other logs are flushed."""
    import logging

    bad, good = PartitionLog.open(tmp_path / "bad"), PartitionLog.open(tmp_path / "good")
    durability = Durability(run_in_thread=lambda fn, *args: _inline(fn, *args))
    try:
        bad.append(entries(1, 3))
        good.append(entries(1, 3))

        def eio(fd):
            raise OSError(errno.EIO, "Input/output error")

        with caplog.at_level(logging.ERROR, logger="partita.durability"):
            monkeypatch.setattr(os, "fdatasync", eio)
            durability.note_write(bad, "everysec")
            await durability.flush_everysec_now()
            monkeypatch.undo()
            assert bad.sync_failure is not None and "Input/output error" in durability.last_flush_error
            # An append that made it in before the failure noted the log again.
            durability.note_write(bad, "everysec")
            durability.note_write(good, "everysec")
            durability.last_flush_error = None
            await durability.flush_everysec_now()
        assert durability.last_flush_error is None
        assert good.recovery_point == 3 and bad.recovery_point == 0
        failures = [r for r in caplog.records if "background fsync failed" in r.getMessage()]
        assert len(failures) == 1 and "Input/output error" in failures[0].getMessage()
    finally:
        durability.close()
        bad.close()
        good.close()


async def _inline(fn, *args):
    return fn(*args)


# -- replies sent by the thread once the syncs succeeded -----------------------


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_sends_go_out_after_the_syncs_and_before_the_signal(tmp_path):
    a, b = socket.socketpair()
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    try:
        os.write(good, b"x" * 4096)
        before = _open_fds()
        result = _run([good], [(a.fileno(), b"+first\r\n"), (a.fileno(), b"+second\r\n")])
        # Signalled only after the sends: the bytes are there already.
        b.setblocking(False)
        assert b.recv(100) == b"+first\r\n+second\r\n"
        assert result == (None, [8, 9])
        assert _open_fds() == before  # the thread closed its dups
    finally:
        os.close(good)
        a.close()
        b.close()


def test_a_failed_sync_sends_nothing():
    a, b = socket.socketpair()
    r, w = os.pipe()  # cannot be synced: EINVAL
    try:
        before = _open_fds()
        assert _run([r], [(a.fileno(), b"+OK\r\n")]) == ((r, errno.EINVAL), [0])
        # Nor one handed to the job after it started (add_send).
        assert _run([r], [], added=[(a.fileno(), b"+OK\r\n")]) == ((r, errno.EINVAL), [0])
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(100)  # never acknowledged
        assert _open_fds() == before
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_socket_closed_after_start_is_not_confused_with_its_successor(tmp_path):
    """The connection may close while its reply waits on the thread, and a
    new client may get the same descriptor number: the reply must still go
    to the first peer (the job sends on a dup), never to the new one."""
    fsync = _module()
    # A first job that keeps the thread busy a while (jobs run in order).
    big = os.open(tmp_path / "big", os.O_CREAT | os.O_WRONLY)
    os.write(big, os.urandom(1 << 20) * 32)
    a, b = socket.socketpair()
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    others = []
    try:
        slow = fsync.start([big], wake)
        number = a.fileno()
        job = fsync.start([big], wake, [(number, b"+mine\r\n")])
        a.close()
        while True:  # take descriptor numbers until the closed one is reused
            c, d = socket.socketpair()
            others.append((c, d))
            if number in (c.fileno(), d.fileno()):
                break
        assert not _done(fsync, job), "the first job should still be syncing"
        deadline = time.monotonic() + 30
        while not _done(fsync, job):
            assert time.monotonic() < deadline
            select.select([wake], [], [], 0.5)
        assert fsync.result(slow) is None
        assert fsync.result(job) is None and fsync.sent(job) == [7]
        b.settimeout(5)
        assert b.recv(100) == b"+mine\r\n"
        for c, d in others:
            for s in (c, d):
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(100)
    finally:
        for c, d in others:
            c.close()
            d.close()
        os.close(big)
        os.close(wake)
        b.close()


def _done(fsync, job):
    try:
        fsync.sent(job)
        return True
    except RuntimeError:  # "the fsync job has not finished"
        return False


def test_a_peer_that_left_gives_its_errno_and_a_full_socket_a_short_count():
    gone_a, gone_b = socket.socketpair()
    full_a, full_b = socket.socketpair()
    gone_b.close()
    full_a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = os.urandom(1 << 20)
    try:
        result, (gone, taken) = _run([], [(gone_a.fileno(), b"+OK\r\n"), (full_a.fileno(), payload)])
        assert result is None
        assert gone in (-errno.EPIPE, -errno.ECONNRESET)
        assert 0 <= taken < len(payload)  # the rest is the caller's to send
        full_b.settimeout(5)
        received = b""
        while len(received) < taken:
            received += full_b.recv(1 << 20)
        assert received == payload[:taken]
    finally:
        for s in (gone_a, full_a, full_b):
            s.close()


def test_sends_it_cannot_take_are_left_to_the_caller():
    a, b = socket.socketpair()
    closed = 1 << 20  # a descriptor number that is not open: no dup
    try:
        assert _run([], [(closed, b"+lost\r\n"), (a.fileno(), b"+OK\r\n")]) == (None, [None, 5])
        assert b.recv(100) == b"+OK\r\n"
    finally:
        a.close()
        b.close()


def test_the_thread_holds_a_bounded_number_of_socket_copies():
    """Each send's socket is dup'ed for the thread, up to SEND_DUPS_MAX
    copies at once in the process: the sends past it (many clients in one
    round) are left to the caller, and nothing stays open after."""
    fsync = _module()
    most = fsync.SEND_DUPS_MAX
    a, b = socket.socketpair()
    try:
        before = _open_fds()
        result, sent = _run([], [(a.fileno(), b"+x\r\n")] * (most + 2), added=[])
        assert result is None and sent == [4] * most + [None, None]
        assert _open_fds() == before
        wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            with held_worker():
                job = fsync.start([], wake, [(a.fileno(), b"+y\r\n")] * most)
                assert _open_fds() == before + most + 1
                assert not fsync.add_send(job, (a.fileno(), b"+z\r\n"))  # past the bound: the caller's
            _wait_done(job)
            assert fsync.sent(job) == [4] * most
        finally:
            os.close(wake)
        assert _open_fds() == before
        b.settimeout(5)
        received = b""
        while len(received) < 4 * (2 * most):
            received += b.recv(1 << 16)
        assert received == b"+x\r\n" * most + b"+y\r\n" * most
    finally:
        a.close()
        b.close()


def test_bad_sends_are_refused_without_a_leak():
    fsync = _module()
    a, b = socket.socketpair()
    try:
        before = _open_fds()
        for sends in ([(a.fileno(), bytearray(b"x"))],  # mutable: the thread reads it unlocked
                      [(a.fileno(), b"ok"), ("3", b"x")],
                      [(a.fileno(), b"ok"), (a.fileno(),)],
                      [b"x"],
                      5):
            with pytest.raises(TypeError):
                fsync.start([], 5, sends)
            assert _open_fds() == before
    finally:
        a.close()
        b.close()


async def test_a_round_hands_its_replies_to_the_thread(tmp_path):
    log = PartitionLog.open(tmp_path / "p")
    durability = Durability()
    a, b = socket.socketpair()
    try:
        log.append(entries(1, 10))
        seq = durability.note_write(log, "always")
        called = []
        durability.when_durable(seq, lambda error, sent: called.append((error, sent)), (a.fileno(), b"+OK\r\n"))
        durability.when_durable(seq, lambda error, sent: called.append((error, sent)))  # no send: its own
        await durability.wait_for_flush(seq)
        await trio.testing.wait_all_tasks_blocked()
        assert called == [(None, 5), (None, None)]
        assert log.recovery_point == 10
        b.setblocking(False)
        assert b.recv(100) == b"+OK\r\n"
    finally:
        durability.close()
        log.close()
        a.close()
        b.close()


async def test_a_failed_round_sends_nothing():
    durability = Durability()
    log = _PipeLog()
    a, b = socket.socketpair()
    try:
        seq = durability.note_write(log, "always")
        called = []
        durability.when_durable(seq, lambda error, sent: called.append((error, sent)), (a.fileno(), b"+OK\r\n"))
        with pytest.raises(DurabilityError):
            await durability.wait_for_flush(seq)
        await trio.testing.wait_all_tasks_blocked()
        assert len(called) == 1 and isinstance(called[0][0], DurabilityError) and called[0][1] is None
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(100)
    finally:
        durability.close()
        a.close()
        b.close()


async def test_writes_that_waited_for_a_round_start_the_next_at_once(monkeypatch):
    """A round starts one scheduler pass after its first writer (writers made
    ready meanwhile join it), except when writes noted during the last round
    were already waiting for it: then at once, so the disk does not sit idle
    for a pass of the loop."""
    gate = trio.Event()
    rounds = []

    async def runner(fn, logs):
        rounds.append(len(logs))
        if len(rounds) == 1:
            await gate.wait()  # the first round is on the disk a while
        fn(logs)

    durability = Durability(run_in_thread=runner)
    passes = []
    real = trio.lowlevel.cancel_shielded_checkpoint

    async def counting_pass():
        passes.append(durability.fsync_count)
        await real()

    monkeypatch.setattr(trio.lowlevel, "cancel_shielded_checkpoint", counting_pass)
    log = _GoodLog()
    called = []
    durability.when_durable(durability.note_write(log, "always"), lambda e, s: called.append(1))
    await trio.testing.wait_all_tasks_blocked()
    assert rounds == [1] and passes == [0]
    durability.when_durable(durability.note_write(log, "always"), lambda e, s: called.append(2))
    gate.set()
    await trio.testing.wait_all_tasks_blocked()
    assert called == [1, 2] and passes == [0]  # the second round took no pass
    durability.when_durable(durability.note_write(log, "always"), lambda e, s: called.append(3))
    await trio.testing.wait_all_tasks_blocked()
    assert called == [1, 2, 3] and passes == [0, 2]  # nothing was waiting: a pass first
    assert durability.fsync_count == 3


class _GoodLog:
    def begin_flush(self):
        return _NoTicket()

    def end_flush(self, ticket):
        pass


class _NoTicket:
    """A ticket with nothing to sync."""

    checkpoints = False

    def __init__(self):
        self.ok = False

    def sync_targets(self):
        return []

    def run(self):
        self.finish(None)

    def finish(self, failure):
        self.ok = True


def _wait_done(job, timeout_s=10.0):
    """Wait (without yielding to trio) until the thread finished ``job``."""
    fsync = _module()
    deadline = time.monotonic() + timeout_s
    while not fsync.done(job):
        assert time.monotonic() < deadline, "the fsync thread never finished"
        time.sleep(0.001)


def test_a_send_added_to_a_started_job_goes_out_with_the_others(tmp_path):
    a, b = socket.socketpair()
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        os.write(good, b"x" * 4096)
        before = _open_fds()
        with held_worker() as fsync:
            job = fsync.start([good], wake, [(a.fileno(), b"+one\r\n")])
            assert fsync.add_send(job, (a.fileno(), b"+two\r\n")) is True
            assert not fsync.done(job)
        assert select.select([wake], [], [], 10)[0]
        b.setblocking(False)
        assert b.recv(100) == b"+one\r\n+two\r\n"
        assert fsync.result(job) is None and fsync.sent(job) == [6, 6]
        # Too late once the thread is done: the caller is told to send it.
        assert fsync.add_send(job, (a.fileno(), b"+three\r\n")) is False
        assert fsync.sent(job) == [6, 6]
        with pytest.raises(BlockingIOError):
            b.recv(100)
        assert _open_fds() == before  # the thread closed every dup
    finally:
        for fd in (good, wake):
            os.close(fd)
        a.close()
        b.close()


def test_a_send_added_while_the_thread_sends_goes_out_too(tmp_path):
    """A deferred commit's writers hand over one by one; one whose turn comes
    after the sync ended, while the thread is still sending the others',
    still goes out from the thread (not from the loop), after them."""
    pairs = [socket.socketpair() for _ in range(3)]
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    fsync = _module()
    try:
        os.write(good, b"x" * 4096)
        (a0, b0), (a1, b1), (a2, b2) = pairs
        before = _open_fds()
        fsync.hold_sends(True)
        try:
            job = fsync.start([good], wake, [(a0.fileno(), b"+zero\r\n"), (a1.fileno(), b"+one\r\n")])
            # The thread synced and sent the first; it waits before the next.
            assert select.select([b0], [], [], 10)[0]
            assert not fsync.done(job)
            assert fsync.add_send(job, (a2.fileno(), b"+two\r\n")) is True
        finally:
            fsync.hold_sends(False)
        assert select.select([wake], [], [], 10)[0]
        assert fsync.result(job) is None and fsync.sent(job) == [7, 6, 6]
        for b, expected in ((b0, b"+zero\r\n"), (b1, b"+one\r\n"), (b2, b"+two\r\n")):
            b.setblocking(False)
            assert b.recv(100) == expected
        # Closed to add_send once the thread found nothing more to send.
        assert fsync.add_send(job, (a2.fileno(), b"+three\r\n")) is False
        assert fsync.sent(job) == [7, 6, 6]
        assert _open_fds() == before  # the thread closed every dup
    finally:
        for fd in (good, wake):
            os.close(fd)
        for a, b in pairs:
            a.close()
            b.close()


def test_a_send_added_to_a_job_started_without_any(tmp_path):
    a, b = socket.socketpair()
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    try:
        assert _run([good], added=[(a.fileno(), b"+OK\r\n")]) == (None, [5])
        b.setblocking(False)
        assert b.recv(100) == b"+OK\r\n"
    finally:
        os.close(good)
        a.close()
        b.close()


def test_bad_added_sends_are_refused(tmp_path):
    good = os.open(tmp_path / "a", os.O_CREAT | os.O_WRONLY)
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        with held_worker() as fsync:
            job = fsync.start([good], wake)
            for bad in ((1, "text"), (1,), [1, b"x"], ("1", b"x")):
                with pytest.raises(TypeError):
                    fsync.add_send(job, bad)
            with pytest.raises(ValueError):  # not a job
                fsync.add_send(object(), (1, b"x"))
        _wait_done(job)
        assert fsync.sent(job) == []
    finally:
        for fd in (good, wake):
            os.close(fd)


async def test_a_handed_over_write_starts_a_round_at_once_and_a_later_one_joins_its_sends(tmp_path):
    """A round starts when the first write is handed over, with no scheduler
    pass; a reply handed over while it runs whose write it covers (a
    deferred commit's other writers) goes out from its thread too."""
    log = PartitionLog.open(tmp_path / "p")
    durability = Durability()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    called = []
    try:
        log.append(entries(1, 10))
        seq = durability.note_write(log, "always")
        with held_worker():
            durability.when_durable(seq, lambda error, sent: called.append(("a", error, sent)), (a.fileno(), b"+1\r\n"))
            assert durability._flushing  # started, no pass taken
            durability.when_durable(seq, lambda error, sent: called.append(("c", error, sent)), (c.fileno(), b"+22\r\n"))
        await durability.wait_for_flush(seq)
        assert durability.fsync_count == 1
        # Both sent by the round's thread: sent is a count, not None.
        assert called == [("a", None, 4), ("c", None, 5)]
        b.setblocking(False)
        d.setblocking(False)
        assert (b.recv(100), d.recv(100)) == (b"+1\r\n", b"+22\r\n")
        assert log.recovery_point == 10
    finally:
        durability.close()
        log.close()
        for s in (a, b, c, d):
            s.close()


async def test_a_round_that_ends_at_a_poll_starts_the_next_there(tmp_path):
    """Writes noted during a round start the next round the moment the
    loop finds the first done (``poll``, as a connection with input does):
    no task switch, no wait for the loop to look at the eventfd."""
    log = PartitionLog.open(tmp_path / "p")
    durability = Durability()
    called = []
    try:
        log.append(entries(1, 10))
        with held_worker():
            first = durability.note_write(log, "always")
            durability.when_durable(first, lambda error, sent: called.append(1))
            job = durability._round.job
            log.append(entries(11, 20))  # offsets 10-29
            second = durability.note_write(log, "always")
            durability.when_durable(second, lambda error, sent: called.append(2))
            assert called == [] and durability._round.job is job  # the first round runs on
        _wait_done(job)
        durability.poll()
        assert called == [1] and durability.fsync_count == 1
        assert durability._round is not None and durability._round.job is not job  # the next, at once
        assert log.recovery_point == 10
        await durability.wait_for_flush(second)
        await trio.testing.wait_all_tasks_blocked()
        assert called == [1, 2] and durability.fsync_count == 2
        assert log.recovery_point == log.log_end_offset == 30
    finally:
        durability.close()
        log.close()


# -- descriptors: rounds in bounded chunks, failures that release and keep dirty --


class _FailingOnce:
    """A real log whose next ``begin_flush`` fails as one does when the
    process is out of descriptors (EMFILE opening a file); then it works
    (``always``: every one fails)."""

    def __init__(self, log, always=False):
        self.log = log
        self.fail = True
        self.always = always

    def begin_flush(self):
        if self.fail:
            self.fail = self.always
            from storage.errors import raise_storage_error

            raise_storage_error(f"open {self.log.directory}", OSError(errno.EMFILE, os.strerror(errno.EMFILE)))
        return self.log.begin_flush()

    def __getattr__(self, name):  # end_flush, closed, sync_failure: the log's
        return getattr(self.log, name)


@pytest.mark.parametrize("policy", ["always", "everysec"])
async def test_a_failure_half_way_through_building_tickets_releases_them_and_keeps_every_log_dirty(
        tmp_path, policy):
    """Tickets begun before a log's ``begin_flush`` failed hold descriptors:
    they are released at once, not left open; and no log of the round drops
    out of durability: under ``always`` the round's writers get the error
    (nothing they wrote is acknowledged) and the once-a-second flush takes
    every log again, without a new write; under ``everysec`` the others are
    flushed at once and the failing one the next second."""
    from storage.handles import FileCache

    cache = FileCache(64)
    logs = [PartitionLog.open(tmp_path / f"p{i}", file_cache=cache) for i in range(5)]
    durability = Durability()
    try:
        for lg in logs:  # a first flush opens the files (their checkpoints written when it returns)
            lg.append(entries(1, 1))
            durability.note_write(lg, "everysec")
        await durability.flush_everysec_now()
        assert [lg.recovery_point for lg in logs] == [1] * 5
        outside = _open_fds() - len(cache)
        failing = _FailingOnce(logs[2])
        for lg in logs:  # the round begins tickets from the last noted: two, then the failure
            lg.append(entries(10, 3))
            seq = durability.note_write(failing if lg is logs[2] else lg, policy)
        if policy == "always":
            with pytest.raises(DurabilityError, match="Too many open files"):
                await durability.wait_for_flush(seq)
        else:
            await durability.flush_everysec_now()
            assert "Too many open files" in durability.last_flush_error
        assert not failing.fail  # it was asked
        assert cache.pinned == 0 and _open_fds() - len(cache) == outside  # nothing left held
        assert [lg.recovery_point for lg in logs] == ([1] * 5 if policy == "always" else [4, 4, 1, 4, 4])
        durability.last_flush_error = None
        await durability.flush_everysec_now()  # no new write: they stayed dirty
        assert durability.last_flush_error is None
        assert [lg.recovery_point for lg in logs] == [4] * 5
        assert cache.pinned == 0 and _open_fds() - len(cache) == outside
    finally:
        durability.close()
        for lg in logs:
            lg.close()


async def test_everysec_a_log_whose_flush_never_begins_does_not_hold_back_the_others(tmp_path):
    """A disk failing under one partition: its group store's journal sync
    failed, and the rewrite each later ``begin_flush`` tries fails too. The
    logs noted with it (the partition's own log among them, which must find
    the failing disk and go offline so that the controller moves the shard)
    are still flushed every second; the failing one stays dirty and its
    error is reported each time."""
    logs = [PartitionLog.open(tmp_path / f"p{i}") for i in range(3)]
    durability = Durability(run_in_thread=lambda fn, *args: _inline(fn, *args))
    try:
        failing = _FailingOnce(logs[1], always=True)
        for round_ in (1, 2):
            for lg in logs:
                lg.append(entries(2 * round_ - 1, 2))
                durability.note_write(failing if lg is logs[1] else lg, "everysec")
            durability.last_flush_error = None
            await durability.flush_everysec_now()
            assert "Too many open files" in durability.last_flush_error
            assert [lg.recovery_point for lg in logs] == [2 * round_, 0, 2 * round_]
        failing.fail = False  # the disk works again: the next second flushes it, with no new write
        durability.last_flush_error = None
        await durability.flush_everysec_now()
        assert durability.last_flush_error is None
        assert [lg.recovery_point for lg in logs] == [4, 4, 4]
    finally:
        durability.close()
        for lg in logs:
            lg.close()


class _CountingFsync:
    """cluster.broker._fsync, counting each job's descriptors, sends, and the
    descriptors pinned in ``cache`` when it starts."""

    def __init__(self, cache):
        self.real = _module()
        self.cache = cache
        self.jobs = []

    def start(self, fds, wake_fd, sends=()):
        self.jobs.append((len(fds), len(sends), self.cache.pinned))
        return self.real.start(fds, wake_fd, sends)

    def __getattr__(self, name):
        return getattr(self.real, name)


async def test_an_always_round_over_many_logs_syncs_in_bounded_chunks(tmp_path, monkeypatch):
    """A round over more logs than its descriptor bound goes in chunks, one
    after the other on the thread, each within the bound (one ticket past
    it at most); the round's writers hear of it once, after its last chunk,
    which alone sends the replies handed over."""
    import cluster.broker.durability as durability_module
    from storage.handles import FileCache

    cache = FileCache(64)  # a ticket pins 8 at most
    counting = _CountingFsync(cache)
    monkeypatch.setattr(durability_module, "_fsync", counting)
    logs = [PartitionLog.open(tmp_path / f"p{i}", file_cache=cache) for i in range(40)]
    durability = Durability(round_fds_max=8)
    a, b = socket.socketpair()
    try:
        for lg in logs:
            lg.append(entries(1, 5))
            seq = durability.note_write(lg, "always")
        seen = []
        durability.when_durable(seq, lambda error, sent: seen.append(
            (error, sent, [lg.recovery_point for lg in logs])), send=(a.fileno(), b"+OK\r\n"))
        await _until(lambda: seen)
        assert seen == [(None, 5, [5] * 40)]  # all synced before the reply, sent by the thread
        b.settimeout(5)
        assert b.recv(100) == b"+OK\r\n"
        assert durability.fsync_count == 1 and len(counting.jobs) > 1
        assert all(n <= 8 + 8 and pinned <= 8 + 8 for n, _, pinned in counting.jobs), counting.jobs
        assert [sends for _, sends, _ in counting.jobs] == [0] * (len(counting.jobs) - 1) + [1]
        assert cache.pinned == 0 and len(cache) <= 64
    finally:
        durability.close()
        a.close()
        b.close()
        for lg in logs:
            lg.close()


async def test_an_everysec_flush_over_many_logs_syncs_in_bounded_chunks(tmp_path):
    from storage.handles import FileCache

    cache = FileCache(64)
    chunks = []

    async def runner(fn, tickets):
        chunks.append((sum(len(t.sync_targets()) for t in tickets), cache.pinned))
        return fn(tickets)

    logs = [PartitionLog.open(tmp_path / f"p{i}", file_cache=cache) for i in range(40)]
    durability = Durability(run_in_thread=runner, round_fds_max=8)
    try:
        for lg in logs:
            lg.append(entries(1, 5))
            durability.note_write(lg, "everysec")
        await durability.flush_everysec_now()
        assert [lg.recovery_point for lg in logs] == [5] * 40
        assert len(chunks) > 1 and all(n <= 8 + 8 and pinned <= 8 + 8 for n, pinned in chunks), chunks
        assert cache.pinned == 0
    finally:
        durability.close()
        for lg in logs:
            lg.close()
