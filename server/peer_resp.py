"""The peer link over RESP: every cluster message as a command on the
cluster bus and its reply, and the client one node uses to reach another.

Owns:

- the RESP form of each message of cluster/peer/messages.py, both ways:
  ``encode_request`` / ``decode_request`` (a request is one command:
  ``REPLFETCH``, ``REPLEPOCH``, ``REPLPAUSE``, ``RAFT``, ``CTRLBEAT``,
  ``CTRLPROPOSE``, ``CTRLJOIN``, ``CTRLMOVE``, ``REPLREAD``, ``GROUPREAD``, ``GROUPINFO``, or ``XADD`` for
  a forwarded append and ``XGROUP`` for a forwarded group change, run on the
  leader as the client commands they are) and ``encode_response`` / ``decode_response`` (its reply, a
  nested RESP value). The bus (server/bus.py) decodes what a peer sends,
  asks the cluster's ``PeerService`` and encodes the answer; ``RespLink``
  does the reverse. A request that does not decode raises ``ValueError``
  (the bus answers ``-ERR malformed <NAME> request: ...``).
- ``RespLink``, the ``cluster.peer.link.PeerLink`` over RESP: one TCP
  connection to a peer's bus port (opened on first use, reopened after a
  failure), ``REPLAUTH`` with this node's ``cluster-secret`` first when one
  is set (every node of a cluster shares it), one command and its reply
  (hiredis). An error reply raises ``Refused`` with its text; a failure
  raises ``Unreachable`` whose ``sent`` says whether the request may have
  left and ``refused`` whether the connection was refused. The secret
  never appears in what it raises or logs: a peer that
  echoes the request (a client port answering an unknown command) is quoted
  with it replaced by ``(redacted)``, as Redis redacts AUTH.

The wire form is the one the nodes spoke before the messages were typed
(issue 29), so a fetch reply is still ``[view, topics-token, discovered,
results]`` with seven fields per fetched partition in the request.

Must not know: what the messages mean (cluster/peer/service.py answers
them, cluster/ builds them).
"""

from __future__ import annotations

import select
from typing import Any

import hiredis
import trio

from cluster.controller.raft import Message
from cluster.errors import Refused
from cluster.peer.link import Unreachable
from cluster.peer.messages import (Ack, AppendRequest, AppendResponse, BeatRequest, BeatResponse, Discovered,
                                   EpochEnd, EpochPartition, EpochRequest, EpochResponse, FetchedPartition,
                                   FetchPartition, FetchRequest, FetchResponse, GroupInfoRequest,
                                   GroupInfoResponse, GroupPart, GroupPartRead, GroupReadRequest,
                                   GroupReadResponse, GroupRequest, GroupResponse, JoinRequest, Membership,
                                   MoveRequest, PartGroup, PartitionEnd, PartRead, PauseRequest, PauseResponse,
                                   ProposeRequest, RaftRequest, ReadPart, ReadRequest, ReadResponse, Request, Response)
from cluster.replication import OUT_OF_RANGE, TOPIC_ID_MISMATCH
from server.reply import OK

CONNECT_TIMEOUT_S = 2.0
FETCH_FIELDS = 9  # topic, n, topic id, offset, last epoch, state token, group token, high watermark, log start
EPOCH_FIELDS = 3  # topic, n, epoch
END_FIELDS = 6  # topic, n, end offset, high watermark, state token, group token
READ_FIELDS = 6  # topic, n, op, start ID, end ID, count
READ_OPS = ("len", "range", "revrange", "after", "after-last")  # cluster.peer.messages.READ_*
# topic, n, group, consumer, op, count, noack, claim ms, after ID, take over, IDs to redeliver (comma-separated),
# max count, max size, served
GROUP_READ_FIELDS = 14
GROUP_READ_OPS = ("new", "history", "pending", "handover")  # cluster.peer.messages.GROUP_*

# The command naming each request on the bus.
NAMES: dict[type, bytes] = {
    FetchRequest: b"REPLFETCH", EpochRequest: b"REPLEPOCH", PauseRequest: b"REPLPAUSE", RaftRequest: b"RAFT",
    BeatRequest: b"CTRLBEAT", ProposeRequest: b"CTRLPROPOSE", JoinRequest: b"CTRLJOIN", MoveRequest: b"CTRLMOVE",
    AppendRequest: b"XADD", ReadRequest: b"REPLREAD", GroupRequest: b"XGROUP", GroupReadRequest: b"GROUPREAD",
    GroupInfoRequest: b"GROUPINFO",
}
GROUP_OPS = ("create", "setid", "destroy", "createconsumer", "delconsumer", "config")
GROUP_COUNTS = ("destroy", "createconsumer", "delconsumer")  # the XGROUP answering an integer


def _int(raw: Any) -> int:
    return int(raw)  # bytes or int; ValueError / TypeError otherwise


def _str(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _int_or_none(raw: Any) -> int | None:
    return None if raw is None else _int(raw)


def _id(raw: bytes) -> tuple[int, int]:
    ms, dash, seq = raw.partition(b"-")
    if not dash:
        raise ValueError(f"not an ID: {raw!r}")
    return _int(ms), _int(seq)


def _id_text(stream_id: tuple[int, int]) -> bytes:
    return b"%d-%d" % (stream_id[0], stream_id[1])


def _groups(items: list, size: int, what: str) -> list:
    if len(items) % size:
        raise ValueError(f"expected {size} fields per {what}, got {len(items)} fields")
    return [items[i:i + size] for i in range(0, len(items), size)]


# -- requests -----------------------------------------------------------------


def encode_request(request: Request) -> list[bytes]:
    """The command (argument list) that carries ``request``."""
    kind = type(request)
    name = NAMES[kind]
    if kind is FetchRequest:
        args = [name, b"%d" % request.replica, request.view, b"%d" % request.max_wait_ms,
                b"%d" % request.max_bytes, request.topics_token]
        for p in request.partitions:
            args += [p.topic, b"%d" % p.n, p.topic_id.encode(), b"%d" % p.offset, b"%d" % p.last_epoch,
                     p.state_token, p.group_token, b"%d" % p.high_watermark, b"%d" % p.log_start]
        return args
    if kind is EpochRequest:
        args = [name]
        for p in request.partitions:
            args += [p.topic, b"%d" % p.n, b"%d" % p.epoch]
        return args
    if kind is PauseRequest:
        return [name, b"%d" % request.shard, b"%d" % request.epoch, b"%d" % request.ms]
    if kind is RaftRequest:
        return [name] + [m.encode() for m in request.messages]
    if kind is BeatRequest:
        args = [name, b"%d" % request.node, request.incarnation.encode()]
        if request.offline:
            args.append(b",".join(b"%d" % s for s in request.offline))
        return args
    if kind is ProposeRequest:
        return [name, request.record]
    if kind is JoinRequest:
        return [name, b"%d" % request.node, request.host.encode(), b"%d" % request.port, b"%d" % request.bus_port]
    if kind is MoveRequest:
        return [name, b"%d" % request.shard]
    if kind is ReadRequest:
        args = [name, b"%d" % request.max_wait_ms]
        for p in request.parts:
            args += [p.topic, b"%d" % p.n, p.op.encode(), _id_text(p.start), _id_text(p.end), b"%d" % p.count]
        return args
    if kind is GroupRequest:
        args = [name, request.op.upper().encode(), request.key, request.group]
        if request.op == "destroy":
            return args
        if request.op in ("createconsumer", "delconsumer"):
            return args + [request.consumer]
        if request.op == "config":
            args += [b"MAXDELIVERIES", b"%d" % request.max_deliveries]
            return args + ([b"DEADLETTER", request.dead_letter_key] if request.dead_letter_key is not None else [])
        args.append(b"$" if request.last_id is None else _id_text(request.last_id))
        if request.entries_read is not None:
            args += [b"ENTRIESREAD", b"%d" % request.entries_read]
        if request.max_deliveries:
            args += [b"MAXDELIVERIES", b"%d" % request.max_deliveries]
            if request.dead_letter_key is not None:
                args += [b"DEADLETTER", request.dead_letter_key]
        return args
    if kind is GroupReadRequest:
        args = [name]
        for p in request.parts:
            args += [p.topic, b"%d" % p.n, p.group, p.consumer, p.op.encode(), b"%d" % p.count,
                     b"1" if p.noack else b"0", b"%d" % p.claim_ms, _id_text(p.after), b"1" if p.take_over else b"0",
                     b",".join(_id_text(i) for i in p.redeliver), b"%d" % p.max_count, b"%d" % p.max_size,
                     b"%d" % p.served]
        return args
    if kind is GroupInfoRequest:  # topic, members (1/0), only given (1/0), only, partition ...
        return [name, request.topic, b"1" if request.members else b"0", b"0" if request.only is None else b"1",
                request.only or b"", *(b"%d" % n for n in request.partitions)]
    assert kind is AppendRequest, kind
    return [name, request.key, *request.options, *request.fields]


def _xadd_id_position(argv: list[bytes]) -> int:
    """Where the ID is in ``XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] threshold
    [LIMIT count]] <* | id> field value ...``."""
    i = 2
    while i < len(argv):
        word = argv[i].upper()
        if word == b"NOMKSTREAM":
            i += 1
        elif word in (b"MAXLEN", b"MINID"):
            i += 2 if argv[i + 1] in (b"=", b"~") else 1
            i += 1
        elif word == b"LIMIT":
            i += 2
        else:
            return i
    raise ValueError("no ID")


def decode_request(argv: list[bytes]) -> Request:
    """The request a bus command carries. Raises ValueError (or IndexError /
    TypeError) when it does not decode."""
    name = argv[0].upper()
    if name == b"REPLFETCH":
        parts = tuple(FetchPartition(topic, _int(n), topic_id.decode(), _int(offset), _int(epoch), state, groups,
                                     _int(hw), _int(start))
                      for topic, n, topic_id, offset, epoch, state, groups, hw, start
                      in _groups(argv[6:], FETCH_FIELDS, "partition"))
        return FetchRequest(_int(argv[1]), argv[2], _int(argv[3]), _int(argv[4]), argv[5], parts)
    if name == b"REPLEPOCH":
        return EpochRequest(tuple(EpochPartition(topic, _int(n), _int(epoch))
                                  for topic, n, epoch in _groups(argv[1:], EPOCH_FIELDS, "partition")))
    if name == b"REPLPAUSE":
        _, shard, epoch, ms = argv
        return PauseRequest(_int(shard), _int(epoch), _int(ms))
    if name == b"RAFT":
        return RaftRequest(tuple(Message.decode(blob) for blob in argv[1:]))
    if name == b"CTRLBEAT":
        if len(argv) not in (3, 4):
            raise ValueError("expected node, incarnation [offline shards]")
        offline = tuple(_int(s) for s in argv[3].split(b",")) if len(argv) == 4 else ()
        return BeatRequest(_int(argv[1]), argv[2].decode(), offline)
    if name == b"CTRLPROPOSE":
        _, record = argv
        return ProposeRequest(record)
    if name == b"CTRLJOIN":
        _, node, host, port, bus_port = argv
        return JoinRequest(_int(node), host.decode(), _int(port), _int(bus_port))
    if name == b"CTRLMOVE":
        _, shard = argv
        return MoveRequest(_int(shard))
    if name == b"REPLREAD":
        parts = []
        for topic, n, op, start, end, count in _groups(argv[2:], READ_FIELDS, "partition"):
            if op.decode() not in READ_OPS:
                raise ValueError(f"unknown read {op!r}")
            parts.append(ReadPart(topic, _int(n), op.decode(), _id(start), _id(end), _int(count)))
        if not parts:
            raise ValueError("no partition")
        return ReadRequest(tuple(parts), _int(argv[1]))
    if name == b"XGROUP":
        return _decode_group(argv)
    if name == b"GROUPREAD":
        parts = []
        for (topic, n, group, consumer, op, count, noack, claim_ms, after, take_over,
             redeliver, max_count, max_size, served) in _groups(argv[1:], GROUP_READ_FIELDS, "partition"):
            if op.decode() not in GROUP_READ_OPS:
                raise ValueError(f"unknown group read {op!r}")
            parts.append(GroupPart(topic, _int(n), group, consumer, op.decode(), _int(count), noack == b"1",
                                   _int(claim_ms), _id(after), take_over == b"1",
                                   tuple(_id(i) for i in redeliver.split(b",")) if redeliver else (),
                                   _int(max_count), _int(max_size), _int(served)))
        if not parts:
            raise ValueError("no partition")
        return GroupReadRequest(tuple(parts))
    if name == b"GROUPINFO":
        _, topic, members, given, only, *partitions = argv
        if members not in (b"0", b"1") or given not in (b"0", b"1"):
            raise ValueError("expected 0 or 1")
        return GroupInfoRequest(topic, tuple(_int(n) for n in partitions), only if given == b"1" else None,
                                members == b"1")
    if name == b"XADD":
        at = _xadd_id_position(argv)
        fields = argv[at + 1:]
        if not fields or len(fields) % 2:
            raise ValueError("expected field value pairs")
        return AppendRequest(argv[1], tuple(argv[2:at + 1]), tuple(fields))
    raise ValueError(f"not a peer request: {argv[0]!r}")


def _decode_group(argv: list[bytes]) -> GroupRequest:
    op = argv[1].decode().lower()
    if op not in GROUP_OPS:
        raise ValueError(f"not a forwarded XGROUP: {argv[1]!r}")
    key, group = argv[2], argv[3]
    if op == "destroy":
        if len(argv) != 4:
            raise ValueError("expected key group")
        return GroupRequest(op, key, group)
    if op in ("createconsumer", "delconsumer"):
        if len(argv) != 5:
            raise ValueError("expected key group consumer")
        return GroupRequest(op, key, group, consumer=argv[4])
    if op == "config":
        options = dict(zip(argv[4::2], argv[5::2]))
        if len(argv) % 2 or b"MAXDELIVERIES" not in options or set(options) - {b"MAXDELIVERIES", b"DEADLETTER"}:
            raise ValueError("expected MAXDELIVERIES [DEADLETTER]")
        return GroupRequest(op, key, group, max_deliveries=_int(options[b"MAXDELIVERIES"]),
                            dead_letter_key=options.get(b"DEADLETTER"))
    last_id = None if argv[4] == b"$" else _id(argv[4])
    options = dict(zip(argv[5::2], argv[6::2]))
    if len(argv) % 2 == 0 or set(options) - {b"ENTRIESREAD", b"MAXDELIVERIES", b"DEADLETTER"}:
        raise ValueError("expected ENTRIESREAD / MAXDELIVERIES / DEADLETTER options")
    entries_read = _int(options[b"ENTRIESREAD"]) if b"ENTRIESREAD" in options else None
    return GroupRequest(op, key, group, last_id, entries_read, _int(options.get(b"MAXDELIVERIES", 0)),
                        options.get(b"DEADLETTER"))


# -- responses -------------------------------------------------------------------


def _fetched(p: FetchedPartition) -> list:
    head = [p.topic, b"%d" % p.n]
    if p.error == OUT_OF_RANGE:
        return head + [p.error.encode(), p.log_start, p.log_end]
    if p.error == TOPIC_ID_MISMATCH:
        return head + [p.error.encode(), p.topic_meta]
    if p.error:
        return head + [p.error.encode()]
    return head + [b"", p.high_watermark, p.log_start, p.log_end, p.batches, p.state_token, p.state,
                   p.group_token, p.group_snapshot, p.group_records]


def encode_response(response: Response) -> Any:
    """The reply value (server/reply.py) that carries ``response``."""
    kind = type(response)
    if kind is Ack:
        return OK
    if kind is FetchResponse:
        discovered = None
        if response.discovered is not None:
            discovered = []
            for d in response.discovered:
                discovered += [d.topic, b"%d" % d.n, d.meta]
        return [response.view, response.topics_token, discovered, [_fetched(p) for p in response.partitions]]
    if kind is EpochResponse:
        return [e.error.encode() if e.error else [e.epoch, e.end_offset] for e in response.ends]
    if kind is PauseResponse:
        out: list = []
        for e in response.ends:
            out += [e.topic, b"%d" % e.n, e.end_offset, e.high_watermark, e.state_token, e.group_token]
        return out
    if kind is BeatResponse:
        return response.commit_index
    if kind is GroupResponse:
        return OK if response.count is None else response.count
    if kind is GroupReadResponse:
        return [[p.count, [list(c) if c.__class__ is tuple else c for c in p.chunks],
                 None if p.claims is None else [x for pair in p.claims for x in pair],
                 [_id_text(i) for i in p.queue], p.pending, _id_text(p.position), p.size]
                for p in response.parts]
    if kind is GroupInfoResponse:
        return [[[[g.name, g.pending, _id_text(g.last_id), g.entries_read, g.lag,
                   [x for c in g.consumers for x in c]] for g in part] for part in response.parts],
                [[m.name, [[name, idle_ms, list(owned)] for name, idle_ms, owned in m.members], list(m.owners)]
                 for m in response.members]]
    if kind is ReadResponse:
        return [[p.length, [_id_text(i) for i in p.ids], list(p.entries), _id_text(p.position)]
                for p in response.parts]
    assert kind is AppendResponse, kind
    return response.id


def _bytes(raw: Any, *, nil: bool = False) -> Any:
    """A blob of a reply: bytes (or, with ``nil``, None). Anything else, an
    integer above all (``bytes(n)`` would allocate n bytes), is malformed."""
    if isinstance(raw, bytes) or (nil and raw is None):
        return raw
    raise ValueError(f"expected a bulk string, got {type(raw).__name__}")


def _decode_fetched(res: list) -> FetchedPartition:
    topic, n, error = _bytes(res[0]), _int(res[1]), _str(res[2])
    if error == OUT_OF_RANGE:
        return FetchedPartition(topic, n, error, log_start=_int(res[3]), log_end=_int(res[4]))
    if error == TOPIC_ID_MISMATCH:
        return FetchedPartition(topic, n, error, topic_meta=_bytes(res[3]))
    if error:
        return FetchedPartition(topic, n, error)
    if len(res) != 12:
        raise ValueError(f"expected 12 fields per fetched partition, got {len(res)}")
    hw, lso, leo, batches, token, state, group_token, snapshot, records = res[3:12]
    return FetchedPartition(topic, n, "", _int(hw), _int(lso), _int(leo), _bytes(batches, nil=True) or b"",
                            _bytes(token), _bytes(state, nil=True), _bytes(group_token), _bytes(snapshot, nil=True),
                            _bytes(records, nil=True) or b"")


def decode_response(request: Request, reply: Any) -> Response:
    """The response to ``request`` a reply carries (not an error reply).
    Raises ValueError (or TypeError / IndexError) when it does not decode."""
    kind = type(request)
    if kind in (RaftRequest, ProposeRequest, JoinRequest, MoveRequest):
        if reply != b"OK":
            raise ValueError("expected OK")
        return Ack()
    if kind is FetchRequest:
        view, topics_token, discovered, results = reply
        _bytes(view), _bytes(topics_token)
        found = None
        if discovered is not None:
            found = tuple(Discovered(_bytes(topic), _int(n), _bytes(meta))
                          for topic, n, meta in _groups(discovered, 3, "topic"))
        return FetchResponse(view, topics_token, found, tuple(_decode_fetched(res) for res in results))
    if kind is EpochRequest:
        if len(reply) != len(request.partitions):
            raise ValueError("expected an answer per partition")
        return EpochResponse(tuple(EpochEnd(_int(e[0]), _int(e[1])) if isinstance(e, list) else EpochEnd(error=_str(e))
                                   for e in reply))
    if kind is PauseRequest:
        return PauseResponse(tuple(PartitionEnd(topic, _int(n), _int(end), _int(hw), state, groups)
                                   for topic, n, end, hw, state, groups in _groups(reply, END_FIELDS, "partition")))
    if kind is BeatRequest:
        if not isinstance(reply, int):
            raise ValueError("expected the commit index")
        return BeatResponse(reply)
    if kind is GroupRequest:
        counts = request.op in GROUP_COUNTS
        if reply == b"OK" and not counts:
            return GroupResponse()
        if not isinstance(reply, int) or not counts:
            raise ValueError("expected OK, or the XGROUP's count")
        return GroupResponse(reply)
    if kind is GroupReadRequest:
        found = []
        for count, chunks, claims, queue, pending, position, size in reply:
            found.append(GroupPartRead(
                _int(count), tuple(tuple(_int(x) for x in c) if isinstance(c, list) else c for c in chunks),
                None if claims is None else tuple(zip(claims[::2], claims[1::2])), tuple(_id(i) for i in queue),
                _int(pending), _id(position), _int(size)))
        if len(found) != len(request.parts):
            raise ValueError("expected an answer per partition")
        return GroupReadResponse(tuple(found))
    if kind is GroupInfoRequest:
        found_parts, found_members = reply
        parts = tuple(tuple(PartGroup(name, _int(pending), _id(last_id), _int_or_none(entries_read), _int_or_none(lag),
                                      tuple((c, _int(p), _int(i)) for c, p, i in _groups(consumers, 3, "consumer")))
                            for name, pending, last_id, entries_read, lag, consumers in part)
                      for part in found_parts)
        if len(parts) != len(request.partitions):
            raise ValueError("expected an answer per partition")
        members = tuple(Membership(name, tuple((member, _int(idle_ms), tuple(_int(n) for n in owned))
                                               for member, idle_ms, owned in rows), tuple(owners))
                        for name, rows, owners in found_members)
        return GroupInfoResponse(parts, members)
    if kind is ReadRequest:
        parts = []
        for length, ids, entries, position in reply:
            if len(ids) != len(entries):
                raise ValueError("expected an ID per entry")
            parts.append(PartRead(_int(length), tuple(_id(i) for i in ids), tuple(entries), _id(position)))
        if len(parts) != len(request.parts):
            raise ValueError("expected an answer per partition")
        return ReadResponse(tuple(parts))
    assert kind is AppendRequest, kind
    if not isinstance(reply, bytes):
        raise ValueError("expected the entry's ID")
    return AppendResponse(reply)


# -- the client ------------------------------------------------------------------------


def _encode(args: list[bytes]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(b"\r\n")
    return b"".join(out)


class _ErrorReply(Exception):
    """An error reply, as hiredis hands it over."""


REDACTED = "(redacted)"


def _connection_refused(error: BaseException) -> bool:
    """Whether connecting failed because the peer's host refused it (every
    address tried answered ECONNREFUSED: nothing listens on the port).
    ``trio.open_tcp_stream`` raises an OSError caused by a group of each
    attempt's error."""
    if isinstance(error, ConnectionRefusedError):
        return True
    cause = error.__cause__
    return (isinstance(error, OSError) and isinstance(cause, BaseExceptionGroup)
            and all(isinstance(e, ConnectionRefusedError) for e in cause.exceptions))


class RespLink:
    """A ``PeerLink`` to one peer's cluster bus port."""

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
            raise Unreachable(f"connect to {self.host}:{self.port} timed out")
        self._reader = hiredis.Reader(replyError=_ErrorReply)
        if self.secret:
            reply = await self._roundtrip([b"REPLAUTH", self.secret.encode()])
            if isinstance(reply, Exception):
                raise Unreachable(f"REPLAUTH to {self.host}:{self.port} refused: {self.redact(str(reply))}")

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
                raise Unreachable(f"{self.host}:{self.port} closed the connection")
            self._reader.feed(data)

    async def call(self, request: Request) -> Response:
        """Send ``request``, return its response. Raises ``Refused`` (the
        peer's error reply, its text) or ``Unreachable``.

        An idempotent request (every one but a forwarded append) that fails
        on a kept connection (the peer restarted since) is tried once more
        on a new one. One that is not is never retried; a kept connection
        the peer has already closed is replaced before sending it, and the
        ``Unreachable`` it may raise says whether it may have reached the
        peer (``sent``)."""
        args = encode_request(request)
        if getattr(request, "idempotent", True):
            reused = self._stream is not None
            try:
                reply = await self._call_once(args)
            except Unreachable:
                if not reused:
                    raise
                reply = await self._call_once(args)
        else:
            reply = await self._call_once(args, check_kept=True)
        if isinstance(reply, _ErrorReply):
            raise Refused(self.redact(str(reply)))
        try:
            return decode_response(request, reply)
        except (ValueError, TypeError, IndexError) as e:
            raise Unreachable(f"link to {self.host}:{self.port}: unexpected reply to {args[0].decode()} "
                              f"({e}): {self.redact(repr(reply))[:200]}", sent=True) from None

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
                    hiredis.ProtocolError) as e:
                reason = (f"no reply within {self.reply_timeout_s:g} s" if isinstance(e, trio.TooSlowError)
                          else self.redact(str(e)) or type(e).__name__)
                raise Unreachable(f"link to {self.host}:{self.port}: {reason}", sent=sent,
                                  refused=not sent and _connection_refused(e)) from None
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
