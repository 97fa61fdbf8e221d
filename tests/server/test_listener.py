"""The accept loop (server/listener.py) at shutdown: ``app.serve`` cancels
the accept loops and closes the listening sockets at once; a loop that a
client's arrival had woken before the cancellation runs once more, and must
end there quietly rather than fail the server's exit (a node SIGTERMed while
clients reconnected exited with 1: ``Fatal: [Errno 9] Bad file descriptor``)."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import trio

from server.listener import accept_loop

TRIALS = 40


class _Conn:
    """What ``make_connection`` builds: a connection with nothing to serve."""

    accepted = 0

    def __init__(self, sock: socket.socket, client) -> None:
        _Conn.accepted += 1
        self.sock = sock

    async def run(self) -> None:
        self.sock.close()


async def _one_shutdown() -> tuple[bool, BaseException | None]:
    """A client arrives; in the same wake-up the shutdown closes the
    listening socket and cancels its loop (``app.serve``'s order). Returns
    whether the shutdown ran first (the loop accepted nothing), and what
    the loop raised."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    address = listening.getsockname()
    twin = os.dup(listening.fileno())  # readable when the listening socket is: the shutdown's cue
    raised: list[BaseException] = []
    accepted = _Conn.accepted
    client = socket.socket()
    try:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def accepting() -> None:
                with scope:
                    try:
                        await accept_loop(SimpleNamespace(config=None), listening, nursery, set(), _Conn,
                                          lambda addr, laddr, fd: None)
                    except Exception as e:
                        raised.append(e)

            async def shutdown() -> None:
                await trio.lowlevel.wait_readable(twin)
                trio.lowlevel.notify_closing(listening)
                listening.close()
                scope.cancel()

            nursery.start_soon(accepting)
            nursery.start_soon(shutdown)
            await trio.testing.wait_all_tasks_blocked()
            client.connect(address)
    finally:
        client.close()
        os.close(twin)
        listening.close()
    return _Conn.accepted == accepted, (raised or [None])[0]


async def test_a_loop_woken_by_a_client_ends_quietly_when_the_shutdown_closed_its_socket_first():
    raced = 0
    for _ in range(TRIALS):
        shutdown_first, raised = await _one_shutdown()
        assert raised is None, f"the accept loop raised {raised!r} after the shutdown closed its socket"
        raced += shutdown_first
    assert raced, "the shutdown never ran between the client's arrival and the woken loop"
