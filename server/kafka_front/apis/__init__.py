"""One module per Kafka API served, and the table of them.

Each module declares ``API_KEY``, ``NAME``, ``VERSIONS`` (the inclusive
range it serves: exactly what ApiVersions advertises) and ``async def
handle(ctx, request)``, which returns the response body (a
``server.kafka.codec`` message), ``None`` (no response: a Produce with
acks=0), or a ``context.Pending`` (a response that waits for its writes'
receipt). A handler parses the decoded request, makes its session calls and
shapes the response; every refusal of the broker becomes an error code in
the response (``server.kafka_front.errors``), as a Kafka broker answers.

Not served (every other key: transactions; docs/kafka.md): the framing
answers as
a Kafka broker does (the request is refused and the connection closed with
the reason logged; ApiVersions at an unknown version gets
UNSUPPORTED_VERSION).
"""

from __future__ import annotations

from server.kafka_front.apis import (
    alter_configs,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_partitions,
    create_topics,
    delete_groups,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    share_acknowledge,
    share_fetch,
    share_group_describe,
    share_group_heartbeat,
    sync_group,
)

MODULES = (produce, fetch, list_offsets, metadata, api_versions, create_topics, delete_topics,
           describe_configs, alter_configs, incremental_alter_configs, create_partitions, describe_cluster,
           init_producer_id, sasl_handshake, sasl_authenticate, offset_commit, offset_fetch, find_coordinator, join_group, heartbeat, leave_group,
           sync_group, describe_groups, list_groups, delete_groups, offset_delete, consumer_group_heartbeat,
           consumer_group_describe, share_group_heartbeat, share_group_describe, share_fetch, share_acknowledge)

HANDLERS = {m.API_KEY: m.handle for m in MODULES}
SERVED = {m.API_KEY: m.VERSIONS for m in sorted(MODULES, key=lambda m: m.API_KEY)}
NAMES = {m.API_KEY: m.NAME for m in MODULES}
