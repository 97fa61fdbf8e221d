"""The fault harness's Kafka check (faultkit.check_kafka) on hand-made logs:
an idempotent producer's record stored twice is a failure within one
(producer id, epoch), and counted apart across epochs (librdkafka's epoch
bump re-sends records the old epoch may have appended)."""

from __future__ import annotations

import pytest

from storage.entry_codec import encode_entry
from storage.producers import sequence_producer, sequence_token
from storage.records import KIND_SEQUENCE, ProducerRecord, encode_batch
from tests.reliability.faultkit import KafkaLedger, check_kafka, kafka_producers

KEY = b"orders#0"
PID = 8888569518781


def _log(batches: list[tuple[bytes, tuple[int, int] | None]]) -> tuple[list[tuple[bytes, dict]], bytes]:
    """One batch of one entry per (value, (epoch, base sequence) or None for
    a non-idempotent append): the entries as XRANGE returns them, and the
    log's bytes as ``Cluster.log_bytes`` reads them (trailing zeros stripped)."""
    entries, log = [], b""
    for offset, (value, producer) in enumerate(batches):
        recs = () if producer is None else (ProducerRecord(KIND_SEQUENCE, producer[0], 0, 1, sequence_producer(PID),
                                                           sequence_token(producer[1])),)
        head, body = encode_batch(offset, [(1, offset, encode_entry((1, offset), [b"value", value]))], 0, 1,
                                  producers=recs)
        log += head + body
        entries.append((b"1-%d" % offset, {b"value": value}))
    return entries, log.rstrip(b"\0")


def _check(batches) -> tuple[int, int, int]:
    entries, log = _log(batches)
    ledger = KafkaLedger([KEY], tag=b"i", idempotent=True)
    ledger.acked[KEY] = [b"i1", b"i2"]
    ledger.offsets[KEY] = [0, 1]
    return check_kafka(ledger, {KEY: entries}, {KEY: kafka_producers(log)})


def test_copies_across_epochs_are_counted_apart():
    assert _check([(b"i1", (0, 7)), (b"i2", (0, 8)), (b"n1", None), (b"i1", (1, 0)), (b"i2", (1, 1))]) == (2, 2, 2)


def test_a_copy_within_one_epoch_fails():
    same = r"1 idempotent records stored twice by one producer epoch.*\(3, \(8888569518781, 0\)\)"
    with pytest.raises(AssertionError, match=same):
        _check([(b"i1", (0, 7)), (b"i2", (0, 8)), (b"i1", (1, 0)), (b"i1", (0, 9))])


def test_a_copy_with_no_producer_record_fails():
    with pytest.raises(AssertionError, match="stored twice by one producer epoch"):
        _check([(b"i1", (0, 7)), (b"i2", (0, 8)), (b"i2", None)])
