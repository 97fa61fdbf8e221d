"""server._fsync (a group commit's syncs on a thread without the GIL) and
the group-commit rounds that use it, with real files and real failures."""

from __future__ import annotations

import errno
import os
import select

import pytest
import trio
import trio.testing

from server.durability import Durability, DurabilityError
from storage.log import PartitionLog
from tests.storage.helpers import entries


def _module():
    from server import _fsync

    return _fsync


def test_the_extension_is_built_and_used():
    """Every install with a C compiler builds it (pyproject ext-modules); a
    build that silently fell back to fsyncing on the event loop must fail CI."""
    from server import durability

    assert durability._fsync is _module()


def _run(fds):
    """Start a job, wait for its eventfd (at most 10 s), return its result."""
    fsync = _module()
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        job = fsync.start(fds, wake)
        readable, _, _ = select.select([wake], [], [], 10)
        assert readable, "the fsync thread never signalled"
        assert os.eventfd_read(wake) == 1
        return fsync.result(job)
    finally:
        os.close(wake)


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
        durability.when_durable(seq, called.append)
        await durability.wait_for_flush(seq)
        assert log.recovery_point == log.log_end_offset == 10
        assert durability.fsync_count == 1
        await trio.testing.wait_all_tasks_blocked()
        assert called == [None]
        durability.when_durable(seq, called.append)  # already durable: at once
        assert called == [None, None]
    finally:
        durability.close()
        log.close()


class _PipeTicket:
    """A ticket whose descriptor cannot be synced (a pipe: EINVAL)."""

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
        durability.when_durable(first, errors.append)
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
