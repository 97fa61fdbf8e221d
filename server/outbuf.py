"""Sending a client's pending replies under ``client-output-buffer-limit``.

Owns: the wait-while-the-peer-is-slow send loop for bytes a non-blocking
``send`` did not take at once, and Redis's output buffer limits for normal
clients: a client whose unsent reply bytes exceed the hard limit, or stay
above the soft limit for soft-seconds, is closed and logged as Redis logs it
("Client ... scheduled to be closed ASAP for overcoming of output buffer
limits."). Limits of 0 mean none (Redis's default for normal clients).

Must not know: RESP, commands. The connection calls ``send_all`` only when a
``send`` came back short (or for batches held for durability), so the hot
path never enters this module. The TLS port (``server.tls``) sends through
``send_all_stream``: same limits, measured on what trio's stream has not
finished sending.

Why this bounds memory: a connection sends before it reads more requests and
never holds more than about one send's worth of replies (``SEND_AT_BYTES``
in connection.py), so a client that never reads stops the server reading its
requests; these limits then close it instead of letting it hold a
connection, a task and up to a batch of replies forever.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from trio.lowlevel import wait_writable

from server.reply import Map, Raw, Set
from storage.streams.stream import Entries

log = logging.getLogger("partita.connection")


async def send_all(conn: Any, data: bytes | memoryview) -> None:
    """Send all of ``data`` on ``conn.sock``; close ``conn`` past its output limits.

    Closing is ``conn.kill()`` followed by a checkpoint: the connection's
    cancel scope ends its task and its ``finally`` closes the socket.
    """
    sock = conn.sock
    view = memoryview(data)
    over_soft_since: float | None = None
    while view:
        try:
            sent = sock.send(view)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            await _close(conn)
            return
        view = view[sent:]
        if not view:
            return
        pending = len(view)
        hard, soft, soft_s = conn.server.config.client_output_buffer_limit["normal"]
        if hard and pending > hard:
            await _close(conn, limit=True)
            return
        if soft and pending > soft:
            now = trio.current_time()
            if over_soft_since is None:
                over_soft_since = now
            remaining_s = over_soft_since + soft_s - now
            if remaining_s <= 0:
                await _close(conn, limit=True)
                return
            with trio.move_on_after(remaining_s):
                await wait_writable(sock)
        else:
            over_soft_since = None
            await wait_writable(sock)


async def send_all_stream(conn: Any, stream: Any, data: bytes | memoryview) -> None:
    """Send all of ``data`` on a trio ``stream`` (the TLS port); close ``conn``
    past its output limits or when the stream breaks.

    A stream's ``send_all`` takes everything or waits, so the whole of
    ``data`` counts as pending until it is done: past the hard limit it must
    drain within a second, past the soft limit within soft-seconds.
    """
    hard, soft, soft_s = conn.server.config.client_output_buffer_limit["normal"]
    pending = len(data)
    limit_s = None
    if hard and pending > hard:
        limit_s = 1.0
    elif soft and pending > soft:
        limit_s = float(soft_s)
    try:
        if limit_s is None:
            await stream.send_all(data)
            return
        with trio.move_on_after(limit_s) as scope:
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await _close(conn)
        return
    if scope.cancelled_caught:
        await _close(conn, limit=True)


async def _close(conn: Any, limit: bool = False) -> None:
    if limit:
        close_over_limits(conn)
    else:
        conn.kill()
    await trio.lowlevel.checkpoint()  # raises Cancelled: the connection's scope ends it


def close_over_limits(conn: Any) -> None:
    """Close ``conn``, whose client is over its output buffer limits, and
    log it as Redis does (also a MONITOR client's backlog of lines)."""
    conn.server.stats.client_output_buffer_limit_disconnections = (
        getattr(conn.server.stats, "client_output_buffer_limit_disconnections", 0) + 1)
    log.warning("Client %s scheduled to be closed ASAP for overcoming of output buffer limits.",
                conn.client.info_line())
    conn.kill()


# Reply types that can carry many bytes in few chunks (log reads: Entries and
# Raw, and the lists / maps XREAD and XREADGROUP wrap them in). Other replies
# are small or as large as the request that asked for them, and the
# connection's every-4096-chunks check covers them.
WEIGHED = frozenset({Entries, Raw, list, tuple, Map, dict, Set})


def weigh(conn: Any, out: list) -> int:
    """Bytes in ``out`` (the batch's encoded replies), counted incrementally.

    Only chunks added since the last call are summed, so a pipeline of N
    replies costs O(total chunks), not O(N^2). Keeps no reference to ``out``
    (an idle connection must not pin its last batch).
    """
    key, counted_chunks, counted_bytes = getattr(conn, "_weighed", (0, 0, 0))
    if key != id(out) or counted_chunks > len(out):
        counted_chunks = counted_bytes = 0
    counted_bytes += sum(map(len, out[counted_chunks:]))
    conn._weighed = (id(out), len(out), counted_bytes)
    return counted_bytes
