"""What an ACL user may do through the Kafka port: each Kafka operation is a RESP command's right.

Owns: the table from Kafka's operations on a topic to the Partita commands
whose rights they need (a user's command categories and key patterns, as
``ACL SETUSER`` gives them, govern its Kafka requests exactly as its RESP
commands), ``require`` (the refusal an API answers:
TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED), which topics
Metadata shows a user (``may_describe``), and the authorized-operations
bits it reports (``topic_operations``). docs/kafka.md "Authorization".

| Kafka operation (APIs) | needs the right to run | on the key |
|---|---|---|
| WRITE (Produce) | XADD | the topic ``t`` or the partition ``t#n`` |
| READ (Fetch, ListOffsets) | XREAD | the topic ``t`` or the partition ``t#n`` |
| CREATE (CreateTopics, Metadata's auto-creation) | TOPIC CREATE | ``t`` |
| DELETE (DeleteTopics) | TOPIC DELETE | ``t`` |
| ALTER (CreatePartitions), ALTER_CONFIGS (AlterConfigs, IncrementalAlterConfigs) | TOPIC ALTER | ``t`` |
| DESCRIBE_CONFIGS (DescribeConfigs of a topic) | TOPIC DESCRIBE | ``t`` |
| DESCRIBE (Metadata) | any of the above | any of the above |
| DESCRIBE_CONFIGS of the broker | CONFIG GET | (none) |
| IDEMPOTENT_WRITE (InitProducerId) | XADD | (none: Produce checks the keys) |
| READ of a group (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch) | XREAD | (none), and READ of each topic committed or fetched |
| DESCRIBE of a group (DescribeGroups, ListGroups) | XINFO GROUPS | (none) |
| DELETE of a group (DeleteGroups, OffsetDelete) | XGROUP DESTROY | (none) |
| READ of a share group (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge) | XREAD | (none) |
| READ of a topic by a share consumer: acquiring (ShareFetch) | XREADGROUP | the topic or the partition |
| READ of a topic by a share consumer: acknowledging (ShareFetch, ShareAcknowledge) | XACK | the topic or the partition |
| DESCRIBE of a share group (ShareGroupDescribe) | XINFO GROUPS | (none) |

The topic key covers every partition, as ``XADD t`` / ``XREAD ... t``
reach them all; a partition key covers that partition. DESCRIBE follows
Kafka's rule that READ, WRITE, DELETE, ALTER (and the others) imply it: a
producer allowed only XADD on ``orders*`` sees ``orders`` in Metadata.

A client whose user may run every command on every key has ``client.acl``
None (``AclRegistry.login``), and every check here is that None test.

Must not know: sockets, the wire format, what the APIs do with the answer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from cluster.topics import partition_key
from server.kafka import errors as E


class Operation(NamedTuple):
    name: str  # Kafka's AclOperation name
    code: int  # its AclOperation code (authorized-operations bits)
    command: str  # the Partita command whose right it needs
    per_partition: bool  # a partition key grants it too


READ = Operation("READ", 3, "xread", True)
WRITE = Operation("WRITE", 4, "xadd", True)
CREATE = Operation("CREATE", 5, "topic|create", False)
DELETE = Operation("DELETE", 6, "topic|delete", False)
ALTER = Operation("ALTER", 7, "topic|alter", False)
DESCRIBE_CONFIGS = Operation("DESCRIBE_CONFIGS", 10, "topic|describe", False)
ALTER_CONFIGS = Operation("ALTER_CONFIGS", 11, "topic|alter", False)
# A share consumer changes the Redis consumer group its share group is: the rights of
# XREADGROUP (acquiring records) and XACK (acknowledging them) on the partition's key.
SHARE_ACQUIRE = Operation("READ", 3, "xreadgroup", True)
SHARE_ACKNOWLEDGE = Operation("READ", 3, "xack", True)
TOPIC_OPERATIONS = (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)
DESCRIBE_CODE = 8


class AuthorizationFailed(Exception):
    """A topic (or the cluster) the user may not act on: ``code`` is the
    Kafka error (``server.kafka_front.errors.code_for``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _allowed(user: Any, op: Operation, topic: bytes, partitions: range) -> bool:
    if op.command not in user.allowed:
        return False
    if user.may_access_key(topic):
        return True
    return op.per_partition and any(user.may_access_key(partition_key(topic, n)) for n in partitions)


def allowed(ctx: Any, op: Operation, topic: bytes, partition: int | None = None) -> bool:
    """Whether the connection's user may do ``op`` on ``topic`` (on its
    ``partition``, for the per-partition operations)."""
    user = ctx.client.acl
    if user is None:
        return True
    return _allowed(user, op, topic, range(partition, partition + 1) if partition is not None else range(0))


def require(ctx: Any, op: Operation, topic: bytes, partition: int | None = None) -> None:
    """Raise TOPIC_AUTHORIZATION_FAILED unless ``allowed``."""
    if not allowed(ctx, op, topic, partition):
        shown = topic.decode("utf-8", "replace")
        keys = shown if partition is None or not op.per_partition else f"{shown} or {shown}#{partition}"
        raise AuthorizationFailed(
            E.TOPIC_AUTHORIZATION_FAILED,
            f"Not authorized to access topics: [{shown}] (user '{ctx.client.user}' may not run "
            f"{op.command.replace('|', ' ').upper()} on {keys})")


def require_cluster(ctx: Any, command: str) -> None:
    """Raise CLUSTER_AUTHORIZATION_FAILED unless the user may run ``command`` (no key)."""
    user = ctx.client.acl
    if user is not None and command not in user.allowed:
        raise AuthorizationFailed(
            E.CLUSTER_AUTHORIZATION_FAILED,
            f"Cluster authorization failed (user '{ctx.client.user}' may not run "
            f"{command.replace('|', ' ').upper()})")


GROUP_READ = "xread"  # JoinGroup ... OffsetCommit / OffsetFetch, FindCoordinator: a consumer's right
GROUP_DESCRIBE = "xinfo|groups"  # DescribeGroups, ListGroups
GROUP_DELETE = "xgroup|destroy"  # DeleteGroups, OffsetDelete


def group_allowed(ctx: Any, command: str) -> bool:
    """Whether the user may run ``command``, the right a group operation needs (a Kafka group is
    no key: ``GROUP_READ`` and the others above)."""
    user = ctx.client.acl
    return user is None or command in user.allowed


def topic_operations(ctx: Any, topic: bytes, partition_count: int) -> list[Operation]:
    """The operations the user may do on a topic of ``partition_count`` partitions."""
    user = ctx.client.acl
    if user is None:
        return list(TOPIC_OPERATIONS)
    partitions = range(partition_count)
    return [op for op in TOPIC_OPERATIONS if _allowed(user, op, topic, partitions)]


def may_describe(ctx: Any, topic: bytes, partition_count: int) -> bool:
    """Whether Metadata shows the topic to the user (DESCRIBE: any operation on it)."""
    return ctx.client.acl is None or bool(topic_operations(ctx, topic, partition_count))


def operation_bits(ctx: Any, topic: bytes, partition_count: int) -> int:
    """Metadata's ``topic_authorized_operations``: the allowed operations and DESCRIBE."""
    ops = topic_operations(ctx, topic, partition_count)
    return sum(1 << op.code for op in ops) | ((1 << DESCRIBE_CODE) if ops else 0)
