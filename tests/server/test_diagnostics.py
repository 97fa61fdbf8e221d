"""server.diagnostics without a server: the one threshold the dispatchers
compare with, who gets the latency sampler, the latency ring's one sample
per second, and the monitor line's quoting (sdscatrepr)."""

from __future__ import annotations

from server.config import Config
from server.diagnostics import LATENCY_TS_LEN, NEVER_US, Diagnostics, LatencyMonitor, monitor_line, quoted


class Client:
    close_after_reply = False
    addr = "127.0.0.1:5"


def test_observe_us_is_the_lowest_threshold_and_zero_with_a_monitor():
    config = Config()
    diagnostics = Diagnostics(config)
    pushed = []
    diagnostics.subscribe(pushed.append)
    assert pushed == [10000]  # slowlog-log-slower-than's default, in µs
    config.set_many([("slowlog-log-slower-than", "-1")])
    assert pushed[-1] == NEVER_US  # everything off: no duration reaches it
    config.set_many([("latency-monitor-threshold", "3")])
    assert pushed[-1] == 3000
    config.set_many([("slowlog-log-slower-than", "500")])
    assert pushed[-1] == 500
    feed = diagnostics.attach_monitor(Client())
    assert pushed[-1] == 0  # every command is shown
    diagnostics.detach_monitor(feed)
    assert pushed[-1] == 500
    count = len(pushed)
    config.set_many([("slowlog-max-len", "5")])
    assert len(pushed) == count  # (pushed only when it changes)


def test_the_latency_sampler_is_handed_out_only_while_the_monitor_is_on():
    config = Config()
    diagnostics = Diagnostics(config)
    handed = []
    diagnostics.hand_sampler(handed.append)
    assert handed == [None]
    config.set_many([("latency-monitor-threshold", "5")])
    sample = handed[-1]
    sample("aof-write", 4)  # under the threshold: not an event
    sample("aof-write", 7)
    assert [event for event, *_ in diagnostics.latency.latest()] == ["aof-write"]
    config.set_many([("latency-monitor-threshold", "0")])
    assert handed[-1] is None


def test_latency_keeps_the_highest_sample_of_each_second_and_the_last_160():
    now = [1000.0]
    latency = LatencyMonitor(clock_s=lambda: now[0])
    latency.add("command", 5)
    latency.add("command", 9)
    latency.add("command", 7)
    assert latency.history("command") == [[1000, 9]]
    for second in range(1, LATENCY_TS_LEN + 10):
        now[0] = 1000.0 + second
        latency.add("command", second % 50 + 1)
    history = latency.history("command")
    assert len(history) == LATENCY_TS_LEN and history[-1][0] == 1000 + LATENCY_TS_LEN + 9
    assert [s[0] for s in history] == sorted(s[0] for s in history)
    assert latency.latest() == [["command", history[-1][0], history[-1][1], 50]]
    assert latency.reset("COMMAND") == 1 and latency.latest() == []


def test_monitor_line_quotes_as_sdscatrepr():
    assert quoted(b"plain text") == b'"plain text"'
    assert quoted(b'q"b\\n\n\r\t\x07\x08\x00\x7f\xff') == b'"q\\"b\\\\n\\n\\r\\t\\a\\b\\x00\\x7f\\xff"'
    assert monitor_line([b"XLEN", b"s"], "1.2.3.4:5", now_us=1_700_000_000_000_042) == (
        b'+1700000000.000042 [0 1.2.3.4:5] "XLEN" "s"\r\n')
