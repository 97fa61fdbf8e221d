"""The replies ``server/failures.py`` renders for the lower layers' refusal codes.

One case per code of the ``REFUSALS`` table: the exact line a client gets.
The Redis ones are redis-server 7.0's texts word for word (t_stream.c;
checked with redis-cli, and byte for byte by the differential tests in
tests/e2e); the others are Partita's own. The storage and cluster layers
carry codes and data only; a new code without a text here fails
``test_every_code_has_a_text``. Then the cluster's errors
(cluster/errors.py): Redis Cluster's texts, and a peer's error relayed byte
for byte.
"""

from __future__ import annotations

import pytest

from cluster import topics
from cluster.broker import groups as group_ops
from cluster.broker.groups import GroupOpError
from cluster.topics import TopicError
from cluster.errors import ClusterDown, Moved, NotEnoughReplicas, Paused, Refused, TryAgain
from cluster.nodes import Node
from server.failures import REFUSALS, entry_too_large, refusal, reply_for
from server.reply import encode
from storage.streams import groups, ids, stream
from storage.streams.groups import GroupError
from storage.streams.ids import StreamIdError
from storage.streams.stream import StreamError

CASES = [
    (StreamIdError(ids.INVALID_ID), "ERR Invalid stream ID specified as stream command argument"),
    (StreamIdError(ids.INVALID_START), "ERR invalid start ID for the interval"),
    (StreamIdError(ids.INVALID_END), "ERR invalid end ID for the interval"),
    (StreamError(stream.ID_ZERO), "ERR The ID specified in XADD must be greater than 0-0"),
    (StreamError(stream.ID_TOO_SMALL),
     "ERR The ID specified in XADD is equal or smaller than the target stream top item"),
    (StreamError(stream.SEQ_EXHAUSTED),  # Redis 7.2+'s text (7.0: "Elements are too large to be stored")
     "ERR The ID specified in XADD is equal or smaller than the target stream top item"),
    (StreamError(stream.SETID_BELOW_MAX_DELETED),
     "ERR The ID specified in XSETID is smaller than current max_deleted_entry_id"),
    (StreamError(stream.ID_EXHAUSTED),
     "ERR The stream has exhausted the last possible ID, unable to add more items"),
    (StreamError(stream.SETID_BELOW_TOP),
     "ERR The ID specified in XSETID is smaller than the target stream top item"),
    (StreamError(stream.SETID_ENTRIES_ADDED_BELOW_LENGTH),
     "ERR The entries_added specified in XSETID is smaller than the target stream length"),
    (GroupError(groups.GROUP_EXISTS, group=b"g"), "BUSYGROUP Consumer Group name already exists"),
    (GroupError(groups.NO_GROUP, group=b"g\xff"), "NOGROUP No such consumer group 'g\ufffd'"),
    (GroupError(groups.NOT_AFTER_LAST_ID, group=b"g"),
     "ERR the IDs delivered to group 'g' must follow its last-delivered-id"),
    (GroupError(groups.NOT_PENDING, group=b"g", consumer=b"c"),
     "ERR the IDs redelivered to consumer 'c' of group 'g' must be pending for it"),
    (GroupError(groups.MAX_DELIVERIES_RANGE, max_deliveries=2**32, maximum=2**32 - 1),
     "ERR MAXDELIVERIES must be between 0 and 4294967295"),
    (GroupError(groups.DEAD_LETTER_NEEDS_KEY), "ERR MAXDELIVERIES needs a DEADLETTER key"),
    (GroupError(groups.DEAD_LETTER_NEEDS_MAX), "ERR DEADLETTER needs MAXDELIVERIES > 0"),
    # The broker's group operations: keys and groups printed as C strings (up to a NUL), as Redis does.
    (GroupOpError(group_ops.KEY_MISSING, key=b"s"),
     "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the "
     "MKSTREAM option to create an empty stream automatically."),
    (GroupOpError(group_ops.NO_SUCH_KEY, key=b"s"), "ERR no such key"),
    (GroupOpError(group_ops.NO_KEY_OR_GROUP, key=b"s\x00tail", group=b"g"),
     "NOGROUP No such key 's' or consumer group 'g'"),
    (GroupOpError(group_ops.NO_GROUP_FOR_KEY, key=b"s", group=b"g\x00tail"),
     "NOGROUP No such consumer group 'g' for key name 's'"),
    (GroupOpError(group_ops.NO_GROUP_TO_READ, key=b"s", group=b"g"),
     "NOGROUP No such key 's' or consumer group 'g' in XREADGROUP with GROUP option"),
    (GroupOpError(group_ops.DEAD_LETTER_IS_SOURCE, key=b"s"),
     "ERR the DEADLETTER key must differ from the stream key"),
    (TopicError(topics.BAD_PARTITION_KEY, key=b"orders#01"),
     "ERR invalid partition key 'orders#01': '#<digits>' at the end of a key is reserved for "
     "'<topic>#<partition>'"),
    (TopicError(topics.PARTITION_OUT_OF_RANGE, partition=4, topic=b"orders", partitions=3),
     "ERR partition 4 out of range: topic 'orders' has 3 partition(s)"),
    (TopicError(topics.NEW_TOPIC_PARTITION_OUT_OF_RANGE, partition=2, partitions=1),
     "ERR partition 2 out of range: a new topic has 1 partition(s)"),
    (TopicError(topics.NEEDS_PARTITION_KEY, topic=b"orders", partitions=3),
     "ERR 'orders' is a topic of 3 partitions: this command needs a partition key ('orders#0' .. 'orders#2')"),
    (TopicError(topics.TOPIC_NAME_HAS_HASH, topic=b"a#b"),
     "ERR invalid topic name 'a#b': '#' is reserved for partition keys ('<topic>#<n>')"),
    (TopicError(topics.TOPIC_NAME_EMPTY), "ERR invalid topic name '': a topic name must not be empty"),
    (TopicError(topics.TOPIC_EXISTS, topic=b"payments"), "ERR topic 'payments' already exists"),
    (TopicError(topics.UNKNOWN_TOPIC, topic=b"missing"), "ERR unknown topic 'missing'"),
    (TopicError(topics.PARTITIONS_ONLY_GROW, topic=b"wide", partitions=4),
     "ERR topic 'wide' has 4 partitions: the partition count can only grow (entries would be lost)"),
    (TopicError(topics.BAD_PARTITION_COUNT, partitions=0, maximum=1024),
     "ERR invalid partition count 0: must be between 1 and 1024"),
    (TopicError(topics.UNKNOWN_CONFIG, name=b"Retention-Days", known=("retention-ms", "fsync")),
     "ERR unknown topic config 'Retention-Days' (known: retention-ms, fsync)"),
    (TopicError(topics.CONFIG_NOT_ONE_OF, value="sometimes", name="fsync", choices=("always", "everysec", "no")),
     "ERR invalid value 'sometimes' for topic config 'fsync': must be one of always, everysec, no"),
    (TopicError(topics.CONFIG_NOT_A_SIZE, value="big", name="segment-bytes"),
     "ERR invalid value 'big' for topic config 'segment-bytes': must be a size (e.g. 1048576, 64kb, 1mb)"),
    (TopicError(topics.CONFIG_NOT_AN_INTEGER, value="soon", name="retention-ms"),
     "ERR invalid value 'soon' for topic config 'retention-ms': must be an integer"),
    (TopicError(topics.CONFIG_OUT_OF_RANGE, value="12", name="segment-bytes", minimum=1024, maximum=2**31),
     "ERR invalid value '12' for topic config 'segment-bytes': must be between 1024 and 2147483648"),
    (TopicError(topics.CONFIG_REPEATED, name="fsync"), "ERR topic config 'fsync' given more than once"),
    (TopicError(topics.RENAME_PARTITION, key=b"orders#1", topic=b"orders", partitions=3),
     "ERR 'orders#1' is a partition of topic 'orders' (3 partitions): RENAME moves whole topics "
     "(rename 'orders')"),
    (TopicError(topics.RENAME_TO_PARTITION, key=b"x#2"),
     "ERR 'x#2' ends with '#<n>', which names a partition: a topic cannot be renamed to it"),
    (TopicError(topics.TOPIC_NEEDS_TOPIC, command="DESCRIBE", key=b"orders#1"),
     "ERR TOPIC DESCRIBE takes a topic name, not a partition key"),
    (TopicError(topics.TOPIC_DELETE_NEEDS_TOPIC, key=b"orders#1"),
     "ERR 'orders#1' is a partition key: partitions cannot be deleted one by one, TOPIC DELETE takes the "
     "topic name"),
    (TopicError(topics.REPLICATION_FACTOR_FIXED, wanted=2, actual=3, cluster=True),
     "ERR REPLICATION-FACTOR 2 not possible: every partition has 3 replica(s) on this cluster's "
     "replication-factor (set replication-factor on every node)"),
]


@pytest.mark.parametrize("exc, line", CASES, ids=[c[0].code for c in CASES])
def test_refusal_text(exc, line):
    assert refusal(exc).line == line
    assert reply_for(exc).line == line  # what the dispatcher sends


def test_every_code_has_a_text():
    assert sorted(exc.code for exc, _ in CASES) == sorted(REFUSALS)


def test_a_refusal_code_without_a_text_is_a_bug_not_a_reply():
    assert reply_for(StreamError("no-such-code")) is None  # the dispatcher logs it as an internal error


def test_an_entry_over_max_entry_bytes():
    assert entry_too_large(2000, 1024).line == (
        "ERR Elements are too large to be stored: the entry has 2000 bytes of fields and values, "
        "over the topic's max-entry-bytes (1024)")


def test_a_full_max_blocked_clients():
    from cluster.broker import TooManyBlockedError

    assert reply_for(TooManyBlockedError(2)).line == (
        "ERR max-blocked-clients reached (2 clients already blocked); retry later or raise max-blocked-clients")


def _line(exc: Exception) -> bytes:
    reply = reply_for(exc)
    assert reply is not None, exc
    assert encode(reply, 2) == encode(reply, 3)
    return encode(reply, 2)


def test_cluster_refusals_become_redis_texts():
    assert _line(Moved(5798, Node(2, "127.0.0.1", 7002))) == b"-MOVED 5798 127.0.0.1:7002\r\n"
    assert _line(NotEnoughReplicas(1, b"orders#2", 2)) == (
        b"-NOTENOUGHREPLICAS 1 in-sync replica(s) of orders#2, min-insync-replicas is 2; nothing was written\r\n")
    assert _line(Paused()) == b"-TRYAGAIN a manual failover is moving this partition's leadership; retry shortly\r\n"
    assert _line(TryAgain("later")) == b"-TRYAGAIN later\r\n"
    assert _line(ClusterDown("no slots")) == b"-CLUSTERDOWN no slots\r\n"


def test_a_peers_error_is_relayed_as_it_was_sent():
    for text in ("ODDCODE", "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                 "TRYAGAIN  two spaces"):
        assert _line(Refused(text)) == b"-" + text.encode() + b"\r\n"
