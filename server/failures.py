"""What the lower layers raise under a command becomes a clear error reply.

The dispatcher calls ``reply_for(exc)`` for any exception a handler lets
escape (a try costs nothing on the success path, so handlers carry no
wrappers): the lower layers' refusals (``storage.errors.Refusal``: a code and
fields, no text) become the replies of ``REFUSALS`` below; disk failures
become the replies after it; anything else is a bug and the dispatcher logs
it as one.

Owns: the Redis text of every refusal code of the layers below
(``REFUSALS``: ``StreamIdError``, ``StreamError``, ``GroupError``,
``TopicError``, the broker's ``GroupOpError``), Redis's word for word where Redis refuses the same thing
(t_stream.c), Partita's own otherwise; a Kafka front-end maps the same codes
to its own errors. The cluster's refusals (cluster/errors.py) carry a code and an explanation;
here they become Redis's texts: ``-MOVED <slot> <host>:<port>`` (Redis
Cluster's redirect), ``-<CODE> <message>`` for the others, and a peer's
error relayed (a forwarded XADD's) exactly as the peer sent it
(``RelayedError``). Then ``DISK_ERRORS`` (what the storage layer raises when
the disk fails or a file is damaged: ``StorageError`` from the funnel, a
bare ``OSError``, ``GroupStateError``) and ``misconf(exc)``, the reply for
each:

- a write failed (``WRITE_FAILED``; disk full: ENOSPC): Redis answers writes
  it cannot persist with ``-MISCONF Errors writing to the AOF file:
  <strerror>``; Partita says ``-MISCONF Errors writing to the partition log:
  <strerror>``. The write is not acknowledged and changed nothing.
- a damaged log batch found by a read (``CORRUPT``): ``-ERR corrupt
  partition log, not served: <file>: corrupt batch at position N: <why>``.
- stored data that cannot be read (``READ_FAILED``: a segment file deleted
  or unreadable, EIO): ``-ERR error reading the partition log: <operation>
  <file> failed: <errno name> (<strerror>)``, never the text of a refused
  write: nothing was written, and writes may well still work.
- damaged consumer-group files: ``-ERR consumer group state unreadable,
  refusing to guess: <file>: <why>``.

The connection stays open, other keys keep working, and the next command
tries the disk again. No traceback is logged: the storage funnel already
logged one line per disk error, and a damaged batch gets one WARNING here (docs/guarantees.md).

Must not know: which command failed or how files are laid out.
"""

from __future__ import annotations

import errno
import logging
import os

from cluster import topics
from cluster.broker import EntryTooLargeError, TooManyBlockedError
from cluster.broker import groups as group_ops
from cluster.errors import ClusterError, CrossSlot, Moved, Refused
from server.errors import INVALID_STREAM_ID, CommandError
from storage.errors import CORRUPT, READ_FAILED, WRITE_FAILED, Refusal, StorageError
from storage.streams import groups, ids, stream
from storage.streams.groups import GroupStateError

DISK_ERRORS = (StorageError, OSError, GroupStateError)
log = logging.getLogger("partita.storage")

TOO_LARGE = "Elements are too large to be stored"
XADD_ID_TOO_SMALL = "The ID specified in XADD is equal or smaller than the target stream top item"


KEY_MUST_EXIST = (
    "The XGROUP subcommand requires the key to exist. Note that for CREATE you may want "
    "to use the MKSTREAM option to create an empty stream automatically."
)


def _c(text: str) -> str:
    """An argument as Redis prints it with ``%s`` (a C string: up to a NUL)."""
    return text.partition("\x00")[0]


def _needs_partition_key(topic: str, partitions: int) -> str:
    return (f"'{topic}' is a topic of {partitions} partitions: this command needs a "
            f"partition key ('{topic}#0' .. '{topic}#{partitions - 1}')")


def _replication_factor_fixed(wanted: int, actual: int, cluster: bool) -> str:
    where = "this cluster's replication-factor" if cluster else "a single node"
    return (f"REPLICATION-FACTOR {wanted} not possible: every partition has {actual} "
            f"replica(s) on {where} (set replication-factor on every node)")


_INVALID_CONFIG_VALUE = "invalid value '{value}' for topic config '{name}': must be "

# Refusal code -> (Redis error code, text). A ``{field}`` in the text is
# filled from the exception's field of that name (bytes as UTF-8, a tuple as
# "a, b, c"); a function gets the fields as keyword arguments.
REFUSALS = {
    ids.INVALID_ID: ("ERR", INVALID_STREAM_ID),
    ids.INVALID_START: ("ERR", "invalid start ID for the interval"),
    ids.INVALID_END: ("ERR", "invalid end ID for the interval"),
    stream.ID_ZERO: ("ERR", "The ID specified in XADD must be greater than 0-0"),
    stream.ID_TOO_SMALL: ("ERR", XADD_ID_TOO_SMALL),
    # ``<ms>-*`` after ``<ms>-<max>``: Redis 7.2+ (7.0 answered TOO_LARGE).
    stream.SEQ_EXHAUSTED: ("ERR", XADD_ID_TOO_SMALL),
    stream.ID_EXHAUSTED: ("ERR", "The stream has exhausted the last possible ID, unable to add more items"),
    stream.SETID_BELOW_MAX_DELETED: ("ERR", "The ID specified in XSETID is smaller than current max_deleted_entry_id"),
    stream.SETID_BELOW_TOP: ("ERR", "The ID specified in XSETID is smaller than the target stream top item"),
    stream.SETID_ENTRIES_ADDED_BELOW_LENGTH: (
        "ERR", "The entries_added specified in XSETID is smaller than the target stream length"),
    # The broker's group operations (cluster/broker/groups.py): Redis's texts.
    group_ops.KEY_MISSING: ("ERR", KEY_MUST_EXIST),
    group_ops.NO_SUCH_KEY: ("ERR", "no such key"),
    group_ops.NO_KEY_OR_GROUP: (
        "NOGROUP", lambda key, group: f"No such key '{_c(key)}' or consumer group '{_c(group)}'"),
    group_ops.NO_GROUP_FOR_KEY: (
        "NOGROUP", lambda key, group: f"No such consumer group '{_c(group)}' for key name '{_c(key)}'"),
    group_ops.NO_GROUP_TO_READ: (
        "NOGROUP", lambda key, group: (f"No such key '{_c(key)}' or consumer group '{_c(group)}' "
                                       "in XREADGROUP with GROUP option")),
    group_ops.DEAD_LETTER_IS_SOURCE: ("ERR", "the DEADLETTER key must differ from the stream key"),
    # The group store's own (BUSYGROUP and the dead-letter settings reach
    # clients through the operations above; the others should not escape):
    groups.GROUP_EXISTS: ("BUSYGROUP", "Consumer Group name already exists"),
    groups.NO_GROUP: ("NOGROUP", "No such consumer group '{group}'"),
    groups.NOT_AFTER_LAST_ID: ("ERR", "the IDs delivered to group '{group}' must follow its last-delivered-id"),
    groups.NOT_PENDING: ("ERR", "the IDs redelivered to consumer '{consumer}' of group '{group}' "
                                "must be pending for it"),
    groups.MAX_DELIVERIES_RANGE: ("ERR", "MAXDELIVERIES must be between 0 and {maximum}"),
    groups.DEAD_LETTER_NEEDS_KEY: ("ERR", "MAXDELIVERIES needs a DEADLETTER key"),
    groups.DEAD_LETTER_NEEDS_MAX: ("ERR", "DEADLETTER needs MAXDELIVERIES > 0"),
    topics.BAD_PARTITION_KEY: (
        "ERR", "invalid partition key '{key}': '#<digits>' at the end of a key is reserved for "
               "'<topic>#<partition>'"),
    topics.PARTITION_OUT_OF_RANGE: (
        "ERR", "partition {partition} out of range: topic '{topic}' has {partitions} partition(s)"),
    topics.NEW_TOPIC_PARTITION_OUT_OF_RANGE: (
        "ERR", "partition {partition} out of range: a new topic has {partitions} partition(s)"),
    topics.NEEDS_PARTITION_KEY: ("ERR", _needs_partition_key),
    topics.TOPIC_NAME_HAS_HASH: (
        "ERR", "invalid topic name '{topic}': '#' is reserved for partition keys ('<topic>#<n>')"),
    topics.TOPIC_NAME_EMPTY: ("ERR", "invalid topic name '': a topic name must not be empty"),
    topics.TOPIC_EXISTS: ("ERR", "topic '{topic}' already exists"),
    topics.UNKNOWN_TOPIC: ("ERR", "unknown topic '{topic}'"),
    topics.PARTITIONS_ONLY_GROW: (
        "ERR", "topic '{topic}' has {partitions} partitions: the partition count can only grow "
               "(entries would be lost)"),
    topics.BAD_PARTITION_COUNT: ("ERR", "invalid partition count {partitions}: must be between 1 and {maximum}"),
    topics.UNKNOWN_CONFIG: ("ERR", "unknown topic config '{name}' (known: {known})"),
    topics.CONFIG_NOT_ONE_OF: ("ERR", _INVALID_CONFIG_VALUE + "one of {choices}"),
    topics.CONFIG_NOT_A_SIZE: ("ERR", _INVALID_CONFIG_VALUE + "a size (e.g. 1048576, 64kb, 1mb)"),
    topics.CONFIG_NOT_AN_INTEGER: ("ERR", _INVALID_CONFIG_VALUE + "an integer"),
    topics.CONFIG_OUT_OF_RANGE: ("ERR", _INVALID_CONFIG_VALUE + "between {minimum} and {maximum}"),
    topics.CONFIG_REPEATED: ("ERR", "topic config '{name}' given more than once"),
    topics.RENAME_PARTITION: (
        "ERR", "'{key}' is a partition of topic '{topic}' ({partitions} partitions): RENAME moves whole topics "
               "(rename '{topic}')"),
    topics.RENAME_TO_PARTITION: (
        "ERR", "'{key}' ends with '#<n>', which names a partition: a topic cannot be renamed to it"),
    topics.TOPIC_NEEDS_TOPIC: ("ERR", "TOPIC {command} takes a topic name, not a partition key"),
    topics.TOPIC_DELETE_NEEDS_TOPIC: (
        "ERR", "'{key}' is a partition key: partitions cannot be deleted one by one, TOPIC DELETE takes the "
               "topic name"),
    topics.REPLICATION_FACTOR_FIXED: ("ERR", _replication_factor_fixed),
}


def _shown(value):
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return value


def refusal(exc: Refusal) -> CommandError:
    """The reply for a lower layer's refusal (its code must be in ``REFUSALS``)."""
    code, text = REFUSALS[exc.code]
    fields = {name: _shown(value) for name, value in exc.fields.items()}
    return CommandError(code, text.format(**fields) if isinstance(text, str) else text(**fields))


def entry_too_large(entry_bytes: int, max_entry_bytes: int) -> CommandError:
    """XADD of an entry over its topic's ``max-entry-bytes`` (nothing is written)."""
    return CommandError("ERR", f"{TOO_LARGE}: the entry has {entry_bytes} bytes of fields and values, "
                               f"over the topic's max-entry-bytes ({max_entry_bytes})")


def too_many_blocked(limit: int) -> CommandError:
    """A blocking read refused: ``max-blocked-clients`` readers already wait."""
    return CommandError("ERR", f"max-blocked-clients reached ({limit} clients already blocked); "
                               "retry later or raise max-blocked-clients")


def misconf(exc: BaseException) -> CommandError:
    if isinstance(exc, GroupStateError):
        return CommandError("ERR", f"consumer group state unreadable, refusing to guess: {exc}")
    kind = exc.code if isinstance(exc, StorageError) else (WRITE_FAILED if exc.errno else CORRUPT)
    if kind == CORRUPT:
        log.warning("refused to serve a damaged batch: %s", exc)
        return CommandError("ERR", f"corrupt partition log, not served: {exc}")
    if kind == READ_FAILED:
        return CommandError("ERR", f"error reading the partition log: {exc}")
    return CommandError("MISCONF", f"Errors writing to the partition log: {os.strerror(exc.errno or errno.EIO)}")


class RelayedError(CommandError):
    """A peer's error reply, relayed with its exact text."""

    def __init__(self, text: str) -> None:
        code, _, message = text.partition(" ")
        super().__init__(code, message)
        self.text = text

    @property
    def line(self) -> str:
        return self.text


def reply_for(exc: BaseException) -> CommandError | None:
    """The reply for a lower layer's exception, or None if it is a bug."""
    if isinstance(exc, Refusal) and exc.code in REFUSALS:
        return refusal(exc)
    if isinstance(exc, EntryTooLargeError):
        return entry_too_large(exc.entry_bytes, exc.max_entry_bytes)
    if isinstance(exc, TooManyBlockedError):
        return too_many_blocked(exc.limit)
    if isinstance(exc, ClusterError):
        if isinstance(exc, Moved):  # Redis Cluster's redirect (docs/replication.md)
            return CommandError("MOVED", f"{exc.slot} {exc.leader.address}")
        if isinstance(exc, CrossSlot):
            return CommandError("CROSSSLOT", "Keys in request don't hash to the same slot")
        if isinstance(exc, Refused):
            return RelayedError(exc.text)
        return CommandError(exc.code, exc.message)
    if isinstance(exc, DISK_ERRORS):
        return misconf(exc)
    return None
