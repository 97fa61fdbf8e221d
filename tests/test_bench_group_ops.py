"""bench/group_ops_bench.py runs end to end: every batch delivered and acked."""

from __future__ import annotations

from bench import group_ops_bench


def test_a_small_pass_delivers_and_acks_every_entry():
    # one_pass asserts each read's count, each XACK's and the empty PEL at the end
    read_us, ack_us = group_ops_bench.one_pass(1_000, 30)
    assert read_us > 0 and ack_us > 0


def test_a_small_pass_through_the_command_handlers_delivers_and_acks_every_entry():
    read_us, ack_us = group_ops_bench.one_pass(1_000, 30, handlers=True)
    assert read_us > 0 and ack_us > 0
