"""Redis syntax lines -> COMMAND DOCS argument structures.

Owns: a parser for the syntax lines commands declare (``XADD key [NOMKSTREAM]
[<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value
[field value ...]``) and its translation into Redis's docs ``arguments``
(each a map of ``name``, ``type`` (key / string / integer / pure-token /
oneof / block), ``token``, ``flags`` (optional, multiple), nested
``arguments``). Clients such as redis-cli 7.2+ build argument hints from it.

Must not know: sockets, RESP, command handlers.

Grammar: ``[ ... ]`` optional, ``< ... >`` a required group, ``a | b``
alternatives, ``X [X ...]`` repetition of what precedes, UPPER-CASE words
are tokens (a token followed by a lower-case word is that argument's token),
lower-case words are arguments.
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN_RE = re.compile(r"\[|\]|<|>|\||\.\.\.|[^\s\[\]<>|]+")
_INTEGER_NAMES = {
    "count", "numkeys", "milliseconds", "timeout", "index", "port", "db", "seconds",
    "partitions", "numreplicas", "client-id", "protover", "limit", "min-idle-time",
    "ms", "unix-time-milliseconds", "entries-read", "cursor", "replication-factor",
}


class SyntaxLineError(ValueError):
    pass


def _tokens(line: str) -> list[str]:
    return _TOKEN_RE.findall(line)


def _is_token_word(word: str) -> bool:
    """Literal words: upper-case letters, or symbols like ``*`` ``=`` ``~`` ``$`` ``>``."""
    letters = [c for c in word if c.isalpha()]
    if letters:
        return all(c.isupper() for c in letters)
    return True


# -- parse to a small tree ------------------------------------------------------
# node: ("word", text) | ("group", optional: bool, alternatives: list[list[node]]) | ("repeat",)


def _parse_seq(toks: list[str], pos: int, closers: str) -> tuple[list[list[Any]], int]:
    alternatives: list[list[Any]] = [[]]
    while pos < len(toks):
        t = toks[pos]
        if t in closers:
            return alternatives, pos
        if t == "|":
            alternatives.append([])
            pos += 1
            continue
        if t in ("[", "<"):
            closer = "]" if t == "[" else ">"
            inner, pos = _parse_seq(toks, pos + 1, closer)
            if pos >= len(toks) or toks[pos] != closer:
                raise SyntaxLineError(f"unclosed {t}")
            alternatives[-1].append(("group", t == "[", inner))
            pos += 1
            continue
        if t in ("]", ">"):
            raise SyntaxLineError(f"unexpected {t}")
        if t == "...":
            alternatives[-1].append(("repeat",))
        else:
            alternatives[-1].append(("word", t))
        pos += 1
    return alternatives, pos


def _shape(nodes: list[Any]) -> list[str]:
    """A comparable outline of nodes (to recognise ``X [X ...]``)."""
    out = []
    for node in nodes:
        if node[0] == "word":
            out.append(node[1])
        elif node[0] == "group":
            out.append(("[" if node[1] else "<") + "|".join(" ".join(_shape(a)) for a in node[2]))
    return out


# -- tree -> Redis docs arguments ----------------------------------------------


def _arg_for_word(word: str, token: str | None) -> dict[str, Any]:
    if _is_token_word(word) and token is None:
        return {"name": word.lower(), "type": "pure-token", "token": word}
    name = word.lower()
    if name == "key" or name.endswith("key") and name != "partition-key-field":
        kind = "key"
    elif name in _INTEGER_NAMES:
        kind = "integer"
    elif name == "pattern":
        kind = "pattern"
    else:
        kind = "string"
    arg: dict[str, Any] = {"name": name, "type": kind}
    if token is not None:
        arg["token"] = token
    return arg


def _convert_seq(nodes: list[Any]) -> list[dict[str, Any]]:
    args: list[dict[str, Any]] = []
    shapes: list[list[str]] = []  # shape of the nodes each arg came from
    i = 0
    while i < len(nodes):
        node = nodes[i]
        if node[0] == "repeat":
            if args:
                _add_flag(args[-1], "multiple")
            i += 1
            continue
        if node[0] == "word":
            word = node[1]
            nxt = nodes[i + 1] if i + 1 < len(nodes) else None
            if _is_token_word(word) and nxt is not None and nxt[0] == "word" and not _is_token_word(nxt[1]):
                args.append(_arg_for_word(nxt[1], word))
                shapes.append([nxt[1]])
                i += 2
                continue
            if _is_token_word(word) and nxt is not None and nxt[0] == "group" and not nxt[1] and word.isalpha():
                arg = _group_arg(nxt[2])  # TYPE <NORMAL | MASTER>: the group, with a token
                if "token" not in arg:
                    arg["token"] = word
                    arg["name"] = word.lower()
                    args.append(arg)
                    shapes.append([word] + _shape([nxt]))
                    i += 2
                    continue
            args.append(_arg_for_word(word, None))
            shapes.append([word])
            i += 1
            continue
        # a group
        _, optional, alternatives = node
        if optional and len(alternatives) == 1 and alternatives[0] and alternatives[0][-1] == ("repeat",):
            body = alternatives[0][:-1]
            body_shape = _shape(body)
            # X [X ...]: the repeated body equals what precedes it.
            n = len(body_shape)
            prev_shape = [s for sh in shapes for s in sh]
            if n and prev_shape[-n:] == body_shape:
                count = 0
                taken = 0
                while taken < n and count < len(shapes):
                    count += 1
                    taken = sum(len(sh) for sh in shapes[-count:])
                if taken == n:
                    group_args = args[-count:]
                    del args[-count:]
                    del shapes[-count:]
                    token = group_args[0].get("token")
                    if token is not None and group_args[0]["type"] != "pure-token":
                        # CONFIG name value [name value ...]: the token once,
                        # then the repeated part.
                        first = dict(group_args[0])
                        del first["token"]
                        group_args = [first] + group_args[1:]
                    if len(group_args) == 1:
                        arg = group_args[0]
                    else:
                        arg = {"name": _name_of(group_args), "type": "block", "arguments": group_args}
                    _add_flag(arg, "multiple")
                    if token is not None and len(group_args) > 1:
                        arg = {"name": token.lower(), "type": "block", "token": token, "arguments": [arg]}
                    elif token is not None:
                        arg["token"] = token
                    args.append(arg)
                    shapes.append(body_shape)
                    i += 1
                    continue
            if not body:  # bare "[...]"
                if args:
                    _add_flag(args[-1], "multiple")
                i += 1
                continue
            arg = _group_arg([body])
            _add_flag(arg, "optional")
            _add_flag(arg, "multiple")
            args.append(arg)
            shapes.append(_shape([node]))
            i += 1
            continue
        arg = _group_arg(alternatives)
        if optional:
            _add_flag(arg, "optional")
        args.append(arg)
        shapes.append(_shape([node]))
        i += 1
    return args


def _group_arg(alternatives: list[list[Any]]) -> dict[str, Any]:
    converted = [_convert_seq(alt) for alt in alternatives if alt]
    if len(converted) == 1:
        inner = converted[0]
        if len(inner) == 1:
            return dict(inner[0])
        return {"name": _name_of(inner), "type": "block", "arguments": inner}
    options = []
    for inner in converted:
        if len(inner) == 1:
            options.append(inner[0])
        else:
            options.append({"name": _name_of(inner), "type": "block", "arguments": inner})
    return {"name": _name_of(options), "type": "oneof", "arguments": options}


def _name_of(args: list[dict[str, Any]]) -> str:
    names = [a["name"] for a in args]
    return "-".join(n for n in names if n not in ("*", "=", "~", "$", ">", "+", "-")) or names[0]


def _add_flag(arg: dict[str, Any], flag: str) -> None:
    flags = arg.setdefault("flags", [])
    if flag not in flags:
        flags.append(flag)


def syntax_arguments(syntax: str, name_words: int = 1) -> list[dict[str, Any]]:
    """Redis docs ``arguments`` for a command's syntax line.

    ``name_words`` leading words are the command name (2 for ``CLIENT KILL``).
    Key arguments get ``key_spec_index`` 0: a command's keys are declared as
    one range (``server.registry``), hence one key spec.
    """
    toks = _tokens(syntax)
    alternatives, pos = _parse_seq(toks[name_words:], 0, "")
    if pos != len(toks) - name_words:
        raise SyntaxLineError(f"unbalanced brackets in {syntax!r}")
    if len(alternatives) != 1:
        args = [_group_arg(alternatives)]
    else:
        args = _convert_seq(alternatives[0])
    for arg in _walk(args):
        if arg.get("type") == "key":
            arg["key_spec_index"] = 0
    return args


def _walk(args: list[dict[str, Any]]):
    for arg in args:
        yield arg
        if "arguments" in arg:
            yield from _walk(arg["arguments"])
