"""Redis's glob-style patterns (KEYS, SCAN MATCH, TOPIC LIST, ACL key patterns).

Owns: ``glob_match``, Redis's ``stringmatchlen`` byte for byte, including
its handling of ``\\``, ``[^...]``, ranges written backwards and an
unterminated ``[``.

Must not know: keys, commands.
"""

from __future__ import annotations


def glob_match(pattern: bytes, string: bytes) -> bool:
    """Redis ``stringmatchlen(pattern, string, nocase=0)``."""
    skip = [False]
    return _match(pattern, 0, string, 0, skip)


def _signed(byte: int) -> int:
    # C ``char`` is signed on the platforms Redis is built for: ranges compare that way.
    return byte - 256 if byte > 127 else byte


def _match(p: bytes, pi: int, s: bytes, si: int, skip: list[bool]) -> bool:
    plen, slen = len(p), len(s)
    while pi < plen and si < slen:
        c = p[pi]
        if c == 42:  # '*'
            while pi + 1 < plen and p[pi + 1] == 42:
                pi += 1
            if pi + 1 == plen:
                return True
            while si < slen:
                if _match(p, pi + 1, s, si, skip):
                    return True
                if skip[0]:
                    return False
                si += 1
            skip[0] = True
            return False
        elif c == 63:  # '?'
            si += 1
        elif c == 91:  # '['
            pi += 1
            negate = pi < plen and p[pi] == 94  # '^'
            if negate:
                pi += 1
            matched = False
            ch = s[si]
            while True:
                if pi < plen and p[pi] == 92 and plen - pi >= 2:  # '\\'
                    pi += 1
                    if p[pi] == ch:
                        matched = True
                elif pi < plen and p[pi] == 93:  # ']'
                    break
                elif pi >= plen:
                    pi -= 1
                    break
                elif plen - pi >= 3 and p[pi + 1] == 45:  # 'a-z'
                    start, end = _signed(p[pi]), _signed(p[pi + 2])
                    if start > end:
                        start, end = end, start
                    pi += 2
                    if start <= _signed(ch) <= end:
                        matched = True
                elif p[pi] == ch:
                    matched = True
                pi += 1
            if negate:
                matched = not matched
            if not matched:
                return False
            si += 1
        else:
            if c == 92 and plen - pi >= 2:  # '\\' escapes the next byte
                pi += 1
                c = p[pi]
            if c != s[si]:
                return False
            si += 1
        pi += 1
        if si == slen:
            while pi < plen and p[pi] == 42:
                pi += 1
            break
    return pi == plen and si == slen
