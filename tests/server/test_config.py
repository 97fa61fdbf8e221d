"""Config: file format, units, command-line overrides, CONFIG SET rules, REWRITE."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import Config, ConfigError, parse_command_line, parse_size


@pytest.mark.parametrize(
    "text, value",
    [("1gb", 2**30), ("512mb", 512 * 2**20), ("4k", 4000), ("4kb", 4096), ("100", 100), ("1G", 10**9), ("2MB", 2 * 2**20),
     # As Redis's memtoull: no digit is 0, leading zeros pass, strtoull saturates, the product wraps.
     ("", 0), ("mb", 0), ("05", 5), ("1Kb", 1024), ("18446744073709551616", 2**64 - 1),
     ("99999999999gb", 99999999999 * 2**30 % 2**64)],
)
def test_sizes_take_redis_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["1x", "1.5mb", "-", "-1", "-1mb", " 5", "5 ", "+5", "-0", "0x10", "1e3", "\u0665"])
def test_bad_sizes(text):
    with pytest.raises(ConfigError):
        parse_size(text)


def test_a_negative_size_is_a_memory_value_error_unless_the_option_takes_minus_one():
    for name in ("maxmemory", "segment-bytes", "repl-backlog-size"):  # Partita's, Redis's, a compatible one
        with pytest.raises(ConfigError) as info:
            Config().set_many([(name, "-1")])
        assert info.value.message == "argument must be a memory value"
    config = Config()
    config.set_many([("retention-bytes", "-1")])
    assert config.retention_bytes == -1


def test_a_size_without_digits_is_zero_for_redis_but_refused_for_retention_bytes():
    """Redis's memtoull reads '' and 'mb' as 0, and Redis's options take them so; Partita's
    retention-bytes would then delete every old segment on a typo: it wants digits."""
    config = Config()
    config.set_many([("maxmemory", "")])
    assert config.maxmemory == 0
    for text in ("", "mb", "-"):
        with pytest.raises(ConfigError) as info:
            Config().set_many([("retention-bytes", text)])
        assert info.value.message == "argument must be a memory value"


def test_defaults():
    c = Config()
    assert (c.port, c.bind, c.fsync, c.maxclients, c.default_partitions) == (6379, "127.0.0.1", "everysec", 10000, 1)
    assert c.proto_max_bulk_len == 512 * 2**20 and c.client_query_buffer_limit == 2**30


def test_file_with_comments_quotes_and_overrides(tmp_path: Path):
    path = tmp_path / "partita.conf"
    path.write_text(
        "# a comment\n\n"
        "port 7000\n"
        "requirepass \"p w#d\"\n"
        "proto-max-bulk-len 2mb\n"
        "fsync always\n"
        "save ''\n"
    )
    c = Config.load(path, [("port", ["7001"]), ("default-partitions", ["4"])])
    assert c.port == 7001 and c.requirepass == "p w#d" and c.proto_max_bulk_len == 2 * 2**20
    assert c.fsync == "always" and c.appendfsync == "always" and c.default_partitions == 4 and c.save == ""


@pytest.mark.parametrize(
    "line, reason",
    [
        ("nosuch 1", "Bad directive or wrong number of arguments"),
        ("port", "\nwrong number of arguments"),
        ("port 1 2", "\nwrong number of arguments"),
        ("maxmemory 1 2", "\nwrong number of arguments"),
        ("save 900", "Invalid save parameters"),
        ("save 0 1", "Invalid save parameters"),
        ("port abc", "argument couldn't be parsed into an integer"),
        ("port ' 5'", "argument couldn't be parsed into an integer"),
        ("port +5", "argument couldn't be parsed into an integer"),
        ("port 05", "argument couldn't be parsed into an integer"),
        ("port 99999999999999999999", "argument couldn't be parsed into an integer"),
        ("maxmemory ' 5'", "argument must be a memory value"),
        ("hz -0", "argument couldn't be parsed into an integer"),
        ("appendonly ' yes'", "argument must be 'yes' or 'no'"),
        ("fsync sometimes", "argument(s) must be one of the following: everysec, always, no"),
        ("maxclients 0", "argument must be between 1 and 4294967295 inclusive"),
        ('requirepass "open', "Unbalanced quotes in configuration line"),
    ],
)
def test_bad_file_lines_name_file_and_line(tmp_path: Path, line, reason):
    path = tmp_path / "p.conf"
    path.write_text("# ok\nport 7000\n" + line + "\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert f"{path}, line 3" in info.value.message
    assert reason in info.value.message


def test_command_line_parsing():
    assert parse_command_line(["a.conf", "--port", "1", "--save", ""]) == (
        Path("a.conf"), [("port", ["1"]), ("save", [""])])
    assert parse_command_line(["--port=2"]) == (None, [("port", ["2"])])
    # As redis-server: the words up to the next --name are the value's; the first may start with --.
    assert parse_command_line(["--save", "900", "1", "--requirepass", "--x", "--port", "3"]) == (
        None, [("save", ["900", "1"]), ("requirepass", ["--x"]), ("port", ["3"])])
    with pytest.raises(ConfigError):
        parse_command_line(["--port"])
    with pytest.raises(ConfigError):
        parse_command_line(["a.conf", "b.conf"])


def test_set_many_is_atomic_and_uses_redis_reasons():
    c = Config()
    with pytest.raises(ConfigError) as info:
        c.set_many([("maxclients", "10"), ("loglevel", "foo")])
    assert info.value.name == "loglevel"
    assert c.maxclients == 10000  # nothing applied
    for pairs, reason in [
        ([("daemonize", "yes")], "can't set immutable config"),
        ([("dir", "/x")], "can't set protected config"),
        ([("maxclients", "1"), ("MAXCLIENTS", "2")], "duplicate parameter"),
        ([("proto-max-bulk-len", "12q")], "argument must be a memory value"),
        ([("appendonly", "maybe")], "can't set immutable config"),
    ]:
        with pytest.raises(ConfigError) as info:
            c.set_many(pairs)
        assert info.value.message == reason
    assert c.set_many([("maxclients", "5"), ("fsync", "no")]) == ["maxclients", "fsync"]
    assert c.maxclients == 5 and c.appendfsync == "no"


def test_hook_can_refuse_and_values_are_restored():
    c = Config()

    def hook(name, value):
        raise ConfigError("nope", name)

    c.on_change(hook)
    with pytest.raises(ConfigError):
        c.set_many([("maxclients", "5")])
    assert c.maxclients == 10000


def test_matching_globs_and_several_patterns():
    c = Config()
    got = c.matching(["port", "max*", "PORT"])
    assert got["port"] == "6379" and got["maxclients"] == "10000"
    assert list(got).count("port") == 1
    assert c.matching(["nosuch"]) == {}
    assert c.matching(["appendonly"]) == {"appendonly": "yes"}


def test_rewrite_keeps_comments_and_round_trips(tmp_path: Path):
    path = tmp_path / "p.conf"
    path.write_text("# keep me\nport 7000\nport 7002\nloglevel notice\n")
    c = Config.load(path)
    c.set_many([("loglevel", "warning"), ("requirepass", "a \"b\""), ("proto-max-bulk-len", "3mb")])
    c.rewrite()
    text = path.read_text()
    assert text.startswith("# keep me\nport 7002\nloglevel warning\n")
    again = Config.load(path)
    assert again.requirepass == 'a "b"' and again.proto_max_bulk_len == 3 * 2**20 and again.port == 7002


def test_rewrite_without_file():
    with pytest.raises(ConfigError) as info:
        Config().rewrite()
    assert info.value.message == "The server is running without a config file"


def test_readme_config_table_lists_every_name():
    from server.config import COMPATIBLE, OPTIONS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = readme.split("accepted for compatibility\nwith Redis", 1)[1]  # the compact list after the table
    missing = [o.name for o in OPTIONS if f"| `{o.name}` |" not in readme
               and (o.doc != COMPATIBLE or f"`{o.name}`" not in listed)]
    assert not missing, f"README.md's config table (or its list of names accepted for compatibility) lacks {missing}"


def test_multi_word_values_of_redis_multi_arg_options_in_file_and_command_line(tmp_path: Path):
    path = tmp_path / "p.conf"
    path.write_text("save 900 1 300 10\nclient-output-buffer-limit pubsub 1mb 512kb 10\nbind 127.0.0.1 ::1\n"
                    "oom-score-adj-values 0 100 800\nreplicaof 10.0.0.1 6380\n")
    c = Config.load(path, parse_command_line(["--bind", "0.0.0.0", "::"])[1])
    assert c.text("save") == "900 1 300 10"
    assert c.client_output_buffer_limit["pubsub"] == (1024**2, 512 * 1024, 10)
    assert c.text("bind") == "0.0.0.0 ::"
    assert c.text("oom-score-adj-values") == "0 100 800"
    assert c.text("replicaof") == c.text("slaveof") == "10.0.0.1 6380"


def test_extra_words_of_a_one_word_option_on_the_command_line_name_it():
    with pytest.raises(ConfigError) as info:
        Config.load(None, parse_command_line(["--port", "7000", "7001"])[1])
    assert info.value.message == ("*** FATAL CONFIG FILE ERROR ***\nReading the configuration: command line option "
                                  "--port\n>>> 'port 7000 7001'\nwrong number of arguments")
