"""A RESP client to another Partita node's cluster bus: the internal link
followers fetch over, and the controller's, forwarding's and failover's.

Owns: one TCP connection to a peer's bus port (server/bus.py; opened on
first use, reopened after a failure), REPLAUTH with this node's
``cluster-secret`` first when one is set (every node of a cluster shares
it), sending one command and reading its reply with hiredis. The secret
never appears in what it raises or logs: a peer that echoes the request (a
client port answering an unknown command) is quoted with it replaced by
``(redacted)``, as Redis redacts AUTH. It implements
``cluster.replica_manager.LeaderEndpoint``.

Must not know: what the commands mean (cluster/replica_manager.py builds
them and reads the replies).
"""

from __future__ import annotations

import select
from typing import Any

import hiredis
import trio

CONNECT_TIMEOUT_S = 2.0


def _encode(args: list[bytes]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(b"\r\n")
    return b"".join(out)


class LinkError(ConnectionError):
    """The peer could not be reached or answered an error to AUTH.

    ``sent`` (set by ``call_once``): True when the link failed after the
    request was sent, so the peer may have run it; False when it never left.
    """

    sent = False


REDACTED = "(redacted)"


class LeaderLink:
    def __init__(self, host: str, port: int, *, secret: str = "", reply_timeout_s: float = 30.0) -> None:
        self.host = host
        self.port = port  # the peer's cluster bus port
        self.secret = secret
        self.reply_timeout_s = reply_timeout_s
        self._stream: trio.SocketStream | None = None
        self._reader: Any = None
        self._lock = trio.Lock()

    async def _connect(self) -> None:
        with trio.move_on_after(CONNECT_TIMEOUT_S) as scope:
            self._stream = await trio.open_tcp_stream(self.host, self.port)
        if scope.cancelled_caught or self._stream is None:
            raise LinkError(f"connect to {self.host}:{self.port} timed out")
        self._reader = hiredis.Reader(replyError=LinkError)
        if self.secret:
            reply = await self._roundtrip([b"REPLAUTH", self.secret.encode()])
            if isinstance(reply, Exception):
                raise LinkError(f"REPLAUTH to {self.host}:{self.port} refused: {self.redact(str(reply))}")

    def redact(self, text: str) -> str:
        """``text`` with the cluster secret replaced by ``(redacted)``."""
        return text.replace(self.secret, REDACTED) if self.secret else text

    async def _roundtrip(self, args: list[bytes]) -> Any:
        assert self._stream is not None
        await self._stream.send_all(_encode(args))
        while True:
            reply = self._reader.gets()
            if reply is not False:
                return reply
            data = await self._stream.receive_some(1 << 20)
            if not data:
                raise LinkError(f"{self.host}:{self.port} closed the connection")
            self._reader.feed(data)

    async def call(self, args: list[bytes]) -> Any:
        """Send one command, return its reply (an error reply is returned as a
        ``LinkError`` instance). Raises LinkError when the link fails.

        Every internal command is idempotent, so a call that fails on a kept
        connection (the peer restarted since) is tried once more on a new one.
        """
        reused = self._stream is not None
        try:
            return await self._call_once(args)
        except LinkError:
            if not reused:
                raise
            return await self._call_once(args)

    async def call_once(self, args: list[bytes]) -> Any:
        """Send one command that is not idempotent (a forwarded XADD) and
        return its reply, never retried. A kept connection the peer has
        already closed is replaced before sending. Raises LinkError whose
        ``sent`` says whether the request may have reached the peer."""
        return await self._call_once(args, check_kept=True)

    def _peer_closed(self) -> bool:
        """Whether the kept, idle connection has input waiting: an idle peer
        sends nothing unasked, so that is its close (EOF or reset)."""
        assert self._stream is not None
        poller = select.poll()
        try:
            poller.register(self._stream.socket.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return True
        return bool(poller.poll(0))

    async def _call_once(self, args: list[bytes], check_kept: bool = False) -> Any:
        async with self._lock:
            done = False
            sent = False
            try:
                if self._stream is not None and check_kept and self._peer_closed():
                    await self.aclose()
                if self._stream is None:
                    with trio.fail_after(self.reply_timeout_s):  # AUTH to a stopped peer
                        await self._connect()
                sent = True
                with trio.fail_after(self.reply_timeout_s):
                    reply = await self._roundtrip(args)
                done = True
                return reply
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                    LinkError, hiredis.ProtocolError) as e:
                reason = (f"no reply within {self.reply_timeout_s:g} s" if isinstance(e, trio.TooSlowError)
                          else self.redact(str(e)) or type(e).__name__)
                error = LinkError(f"link to {self.host}:{self.port}: {reason}")
                error.sent = sent
                raise error from None
            finally:
                if not done:
                    # Failed or cancelled between request and reply: a late
                    # reply must never be read as the next request's.
                    await self.aclose()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except Exception:  # noqa: BLE001 - closing a broken link
                    pass
