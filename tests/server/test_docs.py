"""COMMAND DOCS arguments derived from syntax lines (server.docs)."""

from __future__ import annotations

import pytest

import server.commands  # noqa: F401
from server.docs import SyntaxLineError, syntax_arguments
from server.registry import DECLARED


def test_xadd_line():
    args = syntax_arguments(
        "XADD key [NOMKSTREAM] [<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value [field value ...]"
    )
    assert [a["type"] for a in args] == ["key", "pure-token", "block", "oneof", "block"]
    assert args[0] == {"name": "key", "type": "key", "key_spec_index": 0}
    assert args[1] == {"name": "nomkstream", "type": "pure-token", "token": "NOMKSTREAM", "flags": ["optional"]}
    trim = args[2]
    assert trim["flags"] == ["optional"]
    assert [a["type"] for a in trim["arguments"]] == ["oneof", "oneof", "string", "integer"]
    assert trim["arguments"][3] == {"name": "count", "type": "integer", "token": "LIMIT", "flags": ["optional"]}
    assert [a.get("token") for a in args[3]["arguments"]] == ["*", None]
    assert args[4]["flags"] == ["multiple"]
    assert [a["name"] for a in args[4]["arguments"]] == ["field", "value"]


def test_repetition_of_one_argument():
    assert syntax_arguments("WATCH key [key ...]") == [
        {"name": "key", "type": "key", "flags": ["multiple"], "key_spec_index": 0}
    ]


def test_token_with_value_and_token_with_choice():
    args = syntax_arguments("CLIENT LIST [TYPE <NORMAL | MASTER>] [ID client-id [client-id ...]]", 2)
    assert args[0]["token"] == "TYPE" and args[0]["type"] == "oneof" and args[0]["flags"] == ["optional"]
    assert args[1] == {"name": "client-id", "type": "integer", "token": "ID", "flags": ["multiple", "optional"]}


def test_unbalanced_line_is_an_error():
    with pytest.raises(SyntaxLineError):
        syntax_arguments("FOO [a")


def test_every_registered_syntax_line_parses():
    for spec in DECLARED.values():
        specs = [spec] + list(spec.subcommands.values())
        for s in specs:
            if s.handler is None:
                continue
            syntax_arguments(s.syntax, 2 if "|" in s.name else 1)


def test_token_then_repeated_pairs():
    args = syntax_arguments("TOPIC CREATE topic [CONFIG name value [name value ...]]", 2)
    config = args[1]
    assert (config["type"], config["token"], config["flags"]) == ("block", "CONFIG", ["optional"])
    inner = config["arguments"][0]
    assert inner["flags"] == ["multiple"] and [a["name"] for a in inner["arguments"]] == ["name", "value"]
