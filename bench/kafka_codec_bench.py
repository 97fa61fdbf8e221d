"""Kafka codec throughput on canned bytes, without sockets.

    python bench/kafka_codec_bench.py [--seconds 2.0]

The hot path of the Kafka front-end, timed the way bench/resp_bench.py times
the RESP parser:

- a Produce request carrying one 16-record batch (100-byte values, a key and
  a header each), through ``framing.RequestReader`` (frame, header, body), at
  Produce v7 (what aiokafka and kcat send) and v10 (librdkafka 2.x); then the
  same plus ``records.read_batches`` (CRC-32C and every record), uncompressed
  and lz4 / zstd compressed;
- a Fetch response carrying one such batch (already encoded, as a broker
  holds it), encoded by ``framing.encode_response`` at v11 and v16, and one of
  8 partitions;
- encoding the 16-record batch itself (``records.encode_batch``);
- for scale, kafka-python's own decoder and encoder on the same messages,
  when kafka-python is installed.

Prints the best of 5 rounds (the machine is shared): operations per second
and microseconds per operation.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.kafka import codec, framing, records  # noqa: E402


def bench(name: str, fn, seconds: float, rounds: int = 5) -> float:
    """Best of ``rounds`` timings of ``seconds / rounds`` each (the machine is shared)."""
    best = 0.0
    for _ in range(rounds):
        calls = 0
        started = time.perf_counter()
        deadline = started + seconds / rounds
        while time.perf_counter() < deadline:
            for _ in range(10):
                fn()
            calls += 10
        best = max(best, calls / (time.perf_counter() - started))
    print(f"{name:<60} {best:>10,.0f} ops/s {1e6 / best:>8.2f} us/op")
    return best


def batch_bytes(compression: int) -> bytes:
    batch = records.make_batch(
        [(b"key-%02d" % i, (b"value %02d " % i) * 10, [(b"trace", b"%016x" % i)]) for i in range(16)],
        base_offset=0, timestamps_ms=[1_700_000_000_000 + i for i in range(16)], compression=compression,
        producer_id=4242, producer_epoch=0, base_sequence=0)
    return records.encode_batch(batch)


def produce_request(version: int, recs: bytes) -> bytes:
    P = codec.ProduceRequest
    body = P(acks=-1, timeout_ms=30000, topic_data=[P.TopicProduceData(
        name="orders", partition_data=[P.PartitionProduceData(index=3, records=recs)])])
    return framing.encode_request(0, version, 7, "rdkafka", body)


def fetch_response(partitions: int, recs: bytes):
    F = codec.FetchResponse
    return F(session_id=0, responses=[F.FetchableTopicResponse(
        topic="orders", topic_id=uuid.UUID(int=7), partitions=[
            F.PartitionData(partition_index=p, high_watermark=1000, last_stable_offset=1000,
                            log_start_offset=0, records=recs) for p in range(partitions)])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="per benchmark, split into 5 rounds")
    args = ap.parse_args(argv)
    s = args.seconds
    plain = batch_bytes(records.COMPRESSION_NONE)
    print(f"one 16-record batch: {len(plain)} bytes uncompressed")

    reader = framing.RequestReader()

    def decode(frame):
        def run():
            reader.receive_data(frame)
            return reader.next_event()
        return run

    def decode_with_records(frame):
        def run():
            reader.receive_data(frame)
            req = reader.next_event()
            return records.read_batches(req.body.topic_data[0].partition_data[0].records)
        return run

    body10 = produce_request(10, plain)[4:]
    body10 = body10[codec.RequestHeader.decode_from(body10, 0, 2)[1]:]
    bench("Produce v10 request body decode", lambda: codec.ProduceRequest.decode(body10, 10), s)
    for version in (7, 10):
        bench(f"Produce v{version} request decode (frame+header+body)", decode(produce_request(version, plain)), s)
    for version in (7, 10):
        bench(f"Produce v{version} request decode + 16 records", decode_with_records(produce_request(version, plain)), s)
    for comp in (records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD):
        frame = produce_request(10, batch_bytes(comp))
        bench(f"Produce v10 request decode + 16 records, {records.COMPRESSION_NAMES[comp]}",
              decode_with_records(frame), s)

    for version in (11, 16):
        resp = fetch_response(1, plain)
        bench(f"Fetch v{version} response encode, 1 partition",
              lambda resp=resp, v=version: framing.encode_response(1, v, 9, resp), s)
    resp8 = fetch_response(8, plain)
    bench("Fetch v16 response encode, 8 partitions", lambda: framing.encode_response(1, 16, 9, resp8), s)
    batch = records.read_batches(plain)[0]
    bench("record batch encode, 16 records", lambda: records.encode_batch(batch), s)

    try:
        from kafka.protocol.consumer.fetch import FetchResponse as KFetch
        from kafka.protocol.producer.produce import ProduceRequest as KProduce
    except ImportError:
        return 0
    print("kafka-python on the same messages, for scale:")
    bench("kafka-python Produce v10 request body decode", lambda: KProduce.decode(body10, version=10), s)
    kresp = KFetch.decode(fetch_response(1, plain).encode(16), version=16)  # its version is now 16
    kresp.with_header(correlation_id=9)
    bench("kafka-python Fetch v16 response encode, 1 partition",
          lambda: kresp.encode(header=True, framed=True), s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
