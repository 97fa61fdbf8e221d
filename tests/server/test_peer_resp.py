"""The RESP form of every peer message (server/peer_resp.py): each request
and response round-trips through the bytes the cluster bus carries (the
request as a RESP command, the response as the reply server/reply.py
encodes, both read back with hiredis as a peer reads them), and what does
not decode is refused as malformed."""

from __future__ import annotations

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.controller.raft import KINDS, Entry, Message, Snapshot
from cluster.peer import messages as m
from cluster.replication import DIVERGING, NOT_LEADER, OUT_OF_RANGE, TOPIC_ID_MISMATCH, UNKNOWN_PARTITION
from server import peer_resp
from server.reply import encode

u32 = st.integers(min_value=0, max_value=2**32 - 1)
u63 = st.integers(min_value=0, max_value=2**63 - 1)
signed = st.integers(min_value=-1, max_value=2**62)
blob = st.binary(max_size=40)
name = st.binary(min_size=1, max_size=12)
text = st.text(alphabet="0123456789abcdef-", max_size=16)


def _resp_command(args: list[bytes]) -> list[bytes]:
    """``args`` as a peer sends them, as the bus's parser hands them over."""
    reader = hiredis.Reader()
    reader.feed(b"".join([b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in args]))
    return reader.gets()


def _resp_reply(value) -> object:
    """A reply value as the asking node reads it off the wire."""
    reader = hiredis.Reader()
    reader.feed(encode(value, 2))
    return reader.gets()


fetch_partitions = st.builds(m.FetchPartition, name, u32, text, u63, signed, blob, blob, signed, signed)
fetch_requests = st.builds(m.FetchRequest, u32, blob, u32, u32, blob, st.tuples(fetch_partitions) | st.just(()))
epoch_requests = st.builds(m.EpochRequest, st.lists(st.builds(m.EpochPartition, name, u32, signed),
                                                    max_size=3).map(tuple))
pause_requests = st.builds(m.PauseRequest, u32, u32, u32)


@st.composite
def raft_messages(draw) -> Message:
    """A well-formed Raft message (the shapes cluster/controller/raft.py sends)."""
    kind = draw(st.sampled_from(KINDS))
    term, index = draw(u32), draw(u32)
    entries: tuple = ()
    if kind == "append":
        terms = sorted(draw(st.lists(st.integers(0, term), max_size=3)))
        entries = tuple(Entry(t, index + 1 + k, draw(blob)) for k, t in enumerate(terms))
    snapshot = draw(st.builds(Snapshot, u63, u63, blob)) if kind == "snapshot" else None
    return Message(kind, draw(u32), draw(u32), term, log_term=draw(u63), index=index, commit=draw(u63),
                   entries=entries, reject=draw(st.booleans()), hint=draw(u63), transfer=draw(st.booleans()),
                   snapshot=snapshot)


raft_requests = st.builds(m.RaftRequest, st.lists(raft_messages(), min_size=1, max_size=3).map(tuple))
beat_requests = st.builds(m.BeatRequest, u32, st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
                          st.lists(u32, max_size=3).map(tuple))
propose_requests = st.builds(m.ProposeRequest, st.binary(min_size=1, max_size=60))
join_requests = st.builds(m.JoinRequest, u32, st.text(alphabet="abc.0123456789", min_size=1, max_size=20),
                          u32, u32)
move_requests = st.builds(m.MoveRequest, u32)
# XADD's options up to the ID, as a client may give them.
xadd_options = st.sampled_from([(b"*",), (b"1-1",), (b"NOMKSTREAM", b"*"), (b"MAXLEN", b"10", b"*"),
                                (b"maxlen", b"~", b"10", b"LIMIT", b"5", b"*"), (b"MINID", b"=", b"5-0", b"9-9"),
                                (b"NOMKSTREAM", b"MINID", b"1", b"2-*")])
append_requests = st.builds(m.AppendRequest, name, xadd_options,
                            st.lists(st.tuples(blob, blob), min_size=1, max_size=3).map(
                                lambda pairs: tuple(x for pair in pairs for x in pair)))
stream_ids = st.tuples(u63, u63)
read_requests = st.builds(m.ReadRequest, st.lists(
    st.builds(m.ReadPart, name, u32, st.sampled_from([m.READ_LENGTH, m.READ_RANGE, m.READ_REVRANGE, m.READ_AFTER,
                                                      m.READ_AFTER_LAST]),
              stream_ids, stream_ids, u32), min_size=1, max_size=3).map(tuple), u32)
group_requests = st.one_of(
    st.builds(m.GroupRequest, st.just("destroy"), name, name),
    st.builds(m.GroupRequest, st.sampled_from(["create", "setid"]), name, name, st.none() | stream_ids,
              st.none() | u63),
    st.builds(m.GroupRequest, st.just("create"), name, name, st.none() | stream_ids, st.none() | u63,
              st.integers(1, 100), st.none() | name),
    st.builds(m.GroupRequest, st.sampled_from(["createconsumer", "delconsumer"]), name, name, consumer=name),
    st.builds(m.GroupRequest, st.just("config"), name, name, max_deliveries=st.integers(0, 100),
              dead_letter_key=st.none() | name))
group_read_requests = st.builds(m.GroupReadRequest, st.lists(
    st.builds(m.GroupPart, name, u32, name, name, st.sampled_from([m.GROUP_READ_NEW, m.GROUP_READ_HISTORY,
                                                                 m.GROUP_PENDING, m.GROUP_HAND_OVER]),
              u32, st.booleans(), st.integers(-1, 2**62), stream_ids, st.booleans(),
              st.lists(stream_ids, max_size=3).map(tuple), u32, u32, u32), min_size=1, max_size=3).map(tuple))
group_info_requests = st.builds(m.GroupInfoRequest, name, st.lists(u32, max_size=4).map(tuple),
                                st.none() | blob, st.booleans())
requests = st.one_of(fetch_requests, epoch_requests, pause_requests, raft_requests, beat_requests,
                     propose_requests, join_requests, move_requests, append_requests, read_requests, group_requests,
                     group_read_requests, group_info_requests)


@given(requests)
@settings(max_examples=300)
def test_every_request_round_trips_through_its_command(request):
    argv = peer_resp.encode_request(request)
    assert argv[0] == peer_resp.NAMES[type(request)]
    assert peer_resp.decode_request(_resp_command(argv)) == request


fetched = st.one_of(
    st.builds(m.FetchedPartition, name, u32, st.just(""), u63, u63, u63, blob, blob, st.none() | blob, blob,
              st.none() | blob, blob),
    st.builds(lambda t, n, lso, leo: m.FetchedPartition(t, n, OUT_OF_RANGE, log_start=lso, log_end=leo),
              name, u32, u63, u63),
    st.builds(lambda t, n, meta: m.FetchedPartition(t, n, TOPIC_ID_MISMATCH, topic_meta=meta), name, u32, blob),
    st.builds(m.FetchedPartition, name, u32, st.sampled_from([NOT_LEADER, UNKNOWN_PARTITION, DIVERGING])),
)
fetch_responses = st.builds(m.FetchResponse, blob, blob,
                            st.none() | st.lists(st.builds(m.Discovered, name, u32, blob), max_size=2).map(tuple),
                            st.lists(fetched, max_size=3).map(tuple))
epoch_ends = st.builds(m.EpochEnd, signed, signed) | st.builds(
    m.EpochEnd, error=st.sampled_from([NOT_LEADER, UNKNOWN_PARTITION]))
pause_responses = st.builds(m.PauseResponse, st.lists(st.builds(m.PartitionEnd, name, u32, u63, u63, blob, blob),
                                                      max_size=3).map(tuple))
group_part_reads = st.builds(m.GroupPartRead, u32, st.lists(blob | stream_ids, max_size=3).map(tuple),
                             st.none() | st.lists(st.tuples(st.integers(-1, 2**62), u63), max_size=3).map(tuple),
                             st.lists(stream_ids, max_size=3).map(tuple), u32, stream_ids, u32)
part_groups = st.builds(m.PartGroup, blob, u63, stream_ids, st.none() | u63, st.none() | u63,
                        st.lists(st.tuples(blob, u63, u63), max_size=3).map(tuple))
memberships = st.builds(m.Membership, blob, st.lists(st.tuples(blob, u63, st.lists(u32, max_size=3).map(tuple)),
                                                     max_size=3).map(tuple),
                        st.lists(st.none() | blob, max_size=4).map(tuple))
exchanges = st.one_of(
    st.tuples(fetch_requests, fetch_responses),
    epoch_requests.flatmap(lambda request: st.tuples(st.just(request), st.builds(
        m.EpochResponse, st.tuples(*(epoch_ends for _ in request.partitions))))),
    st.tuples(pause_requests, pause_responses),
    st.tuples(beat_requests, st.builds(m.BeatResponse, u63)),
    st.tuples(append_requests, st.builds(m.AppendResponse, st.binary(min_size=3, max_size=41))),
    group_requests.flatmap(lambda request: st.tuples(st.just(request), st.builds(
        m.GroupResponse, st.integers(0, 1) if request.op in ("destroy", "createconsumer", "delconsumer")
        else st.none()))),
    read_requests.flatmap(lambda request: st.tuples(st.just(request), st.builds(m.ReadResponse, st.tuples(*(
        st.lists(st.tuples(stream_ids, blob), max_size=3).flatmap(lambda found: st.builds(
            m.PartRead, u63, st.just(tuple(i for i, _ in found)), st.just(tuple(e for _, e in found)), stream_ids))
        for _ in request.parts))))),
    group_read_requests.flatmap(lambda request: st.tuples(st.just(request), st.builds(
        m.GroupReadResponse, st.tuples(*(group_part_reads for _ in request.parts))))),
    group_info_requests.flatmap(lambda request: st.tuples(st.just(request), st.builds(
        m.GroupInfoResponse, st.tuples(*(st.lists(part_groups, max_size=3).map(tuple) for _ in request.partitions)),
        st.lists(memberships, max_size=2).map(tuple)))),
    st.tuples(st.one_of(raft_requests, propose_requests, join_requests, move_requests), st.just(m.Ack())),
)


@given(exchanges)
@settings(max_examples=300)
def test_every_response_round_trips_through_its_reply(exchange):
    request, response = exchange
    assert type(response) is m.RESPONSE_OF[type(request)]
    assert peer_resp.decode_response(request, _resp_reply(peer_resp.encode_response(response))) == response


@pytest.mark.parametrize("argv", [
    [b"REPLFETCH", b"x", b"y", b"10", b"10", b"tok"],
    [b"REPLFETCH", b"1", b"v", b"10", b"10", b"tok", b"t", b"0"],  # a partition cut short
    [b"REPLEPOCH", b"a", b"b", b"c"],
    [b"REPLPAUSE", b"0", b"1"],
    [b"RAFT", b"garbage"],
    [b"CTRLBEAT", b"x", b"y"],
    [b"CTRLBEAT", b"1", b"y", b"0,zz"],
    [b"CTRLJOIN", b"4", b"h", b"p", b"1"],
    [b"XADD", b"t#1", b"MAXLEN"],
    [b"XADD", b"t#1", b"*", b"f"],
    [b"REPLVIEW", b"x"],
    [b"XGROUP", b"CREATECONSUMER", b"t#1", b"g"],
    [b"XGROUP", b"CONFIG", b"t#1", b"g", b"DEADLETTER", b"d"],
    [b"XGROUP", b"DESTROY", b"t#1"],
    [b"XGROUP", b"CREATE", b"t#1", b"g", b"$", b"MKSTREAM"],
    [b"REPLREAD", b"0"],
    [b"REPLREAD", b"0", b"t", b"1", b"len", b"0-0", b"0-0"],  # a partition cut short
    [b"REPLREAD", b"0", b"t", b"1", b"drop", b"0-0", b"0-0", b"0"],
    [b"REPLREAD", b"0", b"t", b"1", b"range", b"5", b"0-0", b"0"],
    [b"REPLREAD", b"t", b"1", b"len", b"0-0", b"0-0", b"0"],  # no wait
    [b"GROUPREAD"],
    [b"GROUPREAD", b"t", b"1", b"g", b"c", b"new", b"0", b"0", b"-1", b"0-0", b"0", b"", b"0", b"0"],  # cut short
    [b"GROUPREAD", b"t", b"1", b"g", b"c", b"drop", b"0", b"0", b"-1", b"0-0", b"0", b"", b"0", b"0", b"0"],
    [b"GROUPREAD", b"t", b"1", b"g", b"c", b"new", b"0", b"0", b"-1", b"0-0", b"0", b"1-1,x", b"0", b"0", b"0"],
    [b"GROUPINFO", b"t", b"1", b"0"],  # the group cut short
    [b"GROUPINFO", b"t", b"yes", b"0", b""],
    [b"GROUPINFO", b"t", b"1", b"0", b"", b"x"],
])
def test_what_does_not_decode_is_refused(argv):
    with pytest.raises((ValueError, IndexError, TypeError)):
        peer_resp.decode_request(argv)


def test_a_refused_connection_is_told_apart_from_a_dropped_one():
    """``Unreachable.refused``: nothing listens on the port (the peer's
    process is gone), as opposed to a peer that accepts and drops the
    connection (or never answers)."""
    import socket

    import trio

    from cluster.peer.link import Unreachable

    async def failure(port: int) -> Unreachable:
        link = peer_resp.RespLink("127.0.0.1", port, reply_timeout_s=2)
        with pytest.raises(Unreachable) as caught:
            await link.call(m.BeatRequest(1, "x", ()))
        return caught.value

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        refused = trio.run(failure, port)
    assert (refused.refused, refused.sent) == (True, False)

    async def drops() -> Unreachable:
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        async def accept_and_close():
            while True:
                conn, _ = await listener.accept()
                conn.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_and_close)
            e = await failure(listener.getsockname()[1])
            nursery.cancel_scope.cancel()
        listener.close()
        return e

    dropped = trio.run(drops)
    assert not dropped.refused


_FETCH = m.FetchRequest(2, b"", 100, 1000, b"")
_GOOD_PARTITION = [b"t", b"0", b"", 5, 0, 5, b"", b"tok", None, b"gtok", None, b""]


@pytest.mark.parametrize("partition", [
    _GOOD_PARTITION[:6] + [10**12] + _GOOD_PARTITION[7:],  # batches as an integer: bytes(n) would allocate n
    _GOOD_PARTITION[:8] + [7] + _GOOD_PARTITION[9:],  # the state blob as an integer
    _GOOD_PARTITION[:11] + [[b"x"]],  # group records as an array
    [5] + _GOOD_PARTITION[1:],  # the topic as an integer
    _GOOD_PARTITION[:9],  # cut short
    [b"t", b"0", TOPIC_ID_MISMATCH.encode(), 3],  # the topic's meta as an integer
])
def test_a_fetch_reply_of_the_wrong_shape_is_refused(partition):
    """A leader's fetch reply whose blobs are not bulk strings does not
    decode (the fetcher logs the link's error and asks again) and is never
    handed to the log."""
    with pytest.raises(ValueError):
        peer_resp.decode_response(_FETCH, [b"", b"tok", None, [partition]])
    assert peer_resp.decode_response(_FETCH, [b"", b"tok", None, [_GOOD_PARTITION]]).partitions[0].high_watermark == 5


def test_an_epoch_reply_without_an_answer_per_partition_is_refused():
    """(It reached apply_truncation, whose ValueError went to the fetcher's
    catch-all: a traceback instead of the link's one-line error.)"""
    request = m.EpochRequest((m.EpochPartition(b"t", 0, 1), m.EpochPartition(b"t", 1, 1)))
    with pytest.raises(ValueError, match="an answer per partition"):
        peer_resp.decode_response(request, [[1, 5]])
    assert len(peer_resp.decode_response(request, [[1, 5], b"NOT_LEADER"]).ends) == 2
