"""The Kafka front-end: Kafka clients on ``kafka-port`` act on the same topics as Redis clients.

Owns: the Kafka listener (``listener``: its ports, the endpoints Metadata
names, who may connect), the connection loop (``connection``: frames in,
one request at a time in order, responses out in order, a produce's
response once its receipt is settled), one module per API
(``apis/``: parse the decoded request, call the broker session, shape the
response), the mapping between Kafka records and stream entries
(``mapping``: docs/kafka.md "The mapping"), the Kafka error code of
every broker refusal (``errors``), who a client is (``sasl``: SASL PLAIN
and SCRAM-SHA-256 as the ACL users) and what it may do (``access``: its
ACL rules, as Kafka operations).

The codec it speaks is ``server.kafka`` (sans-IO: declarations, framing,
record batches); everything it does to data goes through a broker
``Session`` (cluster/broker/, ``RecordOps`` for partitions and offsets), as
the RESP front-end's commands do.

Must not know: RESP, the RESP connection's loop (server/connection.py),
storage files.
"""
