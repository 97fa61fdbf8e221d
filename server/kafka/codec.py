"""Encoders, decoders and message classes generated from ``server.kafka.schema``.

Owns: the Kafka wire encoding of every declared message (requests, responses,
headers) at every declared version, and the Python objects they decode into.
Nothing here is written per message: for each message this module builds one
class per struct (slotted, keyword constructor, defaults, equality), and for
each (message, version) it writes the Python source of a decoder and an
encoder from the field declarations and compiles it, the way Kafka's
generator writes ``*Data.java`` from its JSON definitions. Identical struct
layouts across versions share one compiled function.

Must not know: sockets, framing (``server.kafka.framing``), what the fields
mean, the record batch format inside ``records`` fields (kept as raw bytes;
``server.kafka.records`` reads them).

Primitive encodings (Kafka's protocol guide, "Protocol Primitive Types"):
big-endian fixed-width integers; ``bool`` one byte (any non-zero reads as
true); ``uuid`` 16 bytes (``uuid.UUID``); ``string`` int16 length + UTF-8
(``-1`` null); ``bytes``/``records`` int32 length (``-1`` null); arrays int32
count (``-1`` null). In flexible versions strings, bytes, records and arrays
use an unsigned varint of length + 1 (``0`` null), and every struct ends with
a tagged-field section: an unsigned varint count, then per field an unsigned
varint tag, an unsigned varint size and the value. Unknown tags are kept
(``_unknown_tags``) and written back.

Decoding never trusts a length: each declared length or count is checked
against the bytes that remain before anything is allocated for it, so a
hostile frame costs at most its own size. Every malformed input raises
``DecodeError``; nothing else escapes ``decode``.
"""

from __future__ import annotations

import struct as _struct
import uuid as _uuid

from server.kafka import schema as s

__all__ = [
    "DecodeError", "EncodeError", "KafkaMessage", "MESSAGES", "REQUESTS", "RESPONSES",
    "RequestHeader", "ResponseHeader",
]


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the message at that version."""


class EncodeError(ValueError):
    """A value that cannot be encoded at that version (null where not nullable, too long...)."""


# --------------------------------------------------------------------------
# Varints (also used by server.kafka.records)
# --------------------------------------------------------------------------


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 of at most 5 bytes (a Kafka unsigned varint is 32 bits)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise DecodeError("unsigned varint longer than 5 bytes")


def write_uvarint(out: bytearray, n: int) -> None:
    if n < 0 or n > 0xFFFFFFFF:
        raise EncodeError(f"unsigned varint out of range: {n}")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def read_varlong(buf, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """Zig-zag signed varint (varint: max_bytes=5, varlong: 10)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    limit = 7 * max_bytes
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= limit:
            raise DecodeError("varint too long")


def write_varlong(out: bytearray, n: int) -> None:
    z = (n << 1) ^ (n >> 63)
    if z < 0 or z > 0xFFFFFFFFFFFFFFFF:
        raise EncodeError(f"varlong out of range: {n}")
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


# --------------------------------------------------------------------------
# Message classes
# --------------------------------------------------------------------------

_MISSING = object()


class KafkaMessage:
    """Base of every generated struct class: keyword construction, equality, repr, ``to_dict``.

    Subclasses set ``_FIELDS`` (names in declaration order) and ``__slots__``;
    a top-level message class also has ``API_KEY``, ``VERSIONS``, ``FLEXIBLE``,
    ``decode`` and ``encode``.
    """

    __slots__ = ()
    _FIELDS: tuple[str, ...] = ()

    def __repr__(self):
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._FIELDS)
        return f"{type(self).__qualname__}({inner})"

    def to_dict(self) -> dict:
        """Plain nested dicts and lists (for logs and tests)."""
        return {n: _plain(getattr(self, n)) for n in self._FIELDS}


def _plain(v):
    if isinstance(v, KafkaMessage):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _bind(ns: dict, value, hint: str) -> str:
    """Put ``value`` in the generated code's namespace under a fresh name."""
    name = f"_B{len(ns)}_{hint}"
    ns[name] = value
    return name


def _make_class(st: s.Struct, classes: dict[str, type], ns: dict) -> type:
    """One slotted class per struct, shared by all versions of its message."""
    init_params = []
    init_body = []
    for fld in st.fields:
        n = fld.name
        t = fld.type
        if isinstance(t, s.Struct) and fld.default is s._UNSET:
            child = _bind(ns, classes[t.name], t.name)
            init_params.append(f"{n}=_MISSING")
            init_body.append(f"    self.{n} = {child}() if {n} is _MISSING else {n}")
            continue
        default = fld.default_value()
        if isinstance(default, list):
            assert default == []
            init_params.append(f"{n}=_MISSING")
            init_body.append(f"    self.{n} = [] if {n} is _MISSING else {n}")
        else:
            init_params.append(f"{n}={_bind(ns, default, 'def')}")
            init_body.append(f"    self.{n} = {n}")
    init_body.append("    self._unknown_tags = None")
    params = ", ".join(["self", "*"] + init_params) if init_params else "self"
    names = tuple(f.name for f in st.fields) + ("_unknown_tags",)
    # __eq__ compares field by field (tagged fields are compared with their
    # defaults on every encode, so this is on the hot path)
    same = " and ".join(f"self.{n} == other.{n}" for n in names)
    src = (f"def __init__({params}):\n" + "\n".join(init_body) + "\n"
           "def __eq__(self, other):\n"
           "    if type(other) is not type(self):\n"
           "        return NotImplemented\n"
           f"    return {same}\n")
    local: dict = {}
    exec(compile(src, f"<kafka {st.name}>", "exec"), ns, local)
    return type(st.name, (KafkaMessage,), {
        "__slots__": names,
        "_FIELDS": names[:-1],
        "__init__": local["__init__"],
        "__eq__": local["__eq__"],
        "__hash__": None,
        "__module__": __name__,
    })


# --------------------------------------------------------------------------
# Code generation
# --------------------------------------------------------------------------

_FIXED = {p.name: p for p in s.PRIMITIVES if p.struct_code}


def _is_fixed(fl: s.Field) -> bool:
    return isinstance(fl.type, s.Primitive) and fl.type.name in _FIXED


def _compact(fl: s.Field, version: int, flexible: bool) -> bool:
    """Whether ``fl`` uses the compact encodings: in flexible versions, unless the field says otherwise."""
    return flexible if fl.flexible is None else version in fl.flexible


def _layout(st: s.Struct, version: int) -> tuple[list, list[s.Field]]:
    """The untagged fields of ``st`` at ``version`` in wire order, consecutive fixed-width ones
    grouped in lists (one struct call each), and its tagged fields."""
    runs: list = []
    tagged = []
    for fl in st.fields:
        if not fl.present_in(version):
            continue
        if fl.is_tagged_in(version):
            tagged.append(fl)
        elif _is_fixed(fl) and runs and isinstance(runs[-1], list):
            runs[-1].append(fl)
        else:
            runs.append([fl] if _is_fixed(fl) else fl)
    return runs, tagged


class _Generator:
    """Writes the decoder and encoder source of one message at one version.

    ``ns`` is the shared namespace the generated functions are compiled in;
    ``cache`` maps generated source to an already-compiled function name so
    identical layouts (most structs across most versions) compile once.
    """

    def __init__(self, ns: dict, cache: dict, classes: dict[str, type], prefix: str):
        self.ns = ns
        self.cache = cache
        self.classes = classes
        self.prefix = prefix

    # -- helpers ----------------------------------------------------------

    def const(self, value, hint: str) -> str:
        """A name in the namespace bound to ``value`` (struct packers, defaults)."""
        key = ("const", hint, repr(value)) if not callable(value) else ("const", hint, id(value))
        name = self.cache.get(key)
        if name is None:
            name = f"_K{len(self.cache)}_{hint.replace('?', 'o')}"
            self.ns[name] = value
            self.cache[key] = name
        return name

    def packer(self, codes: str) -> tuple[str, str]:
        """Names of the unpack_from and pack functions of ``>codes`` (one Struct per format)."""
        key = ("packer", codes)
        names = self.cache.get(key)
        if names is None:
            st = _struct.Struct(">" + codes)
            names = self.const(st.unpack_from, f"u{codes}"), self.const(st.pack, f"p{codes}")
            self.cache[key] = names
        return names

    def compile(self, kind: str, body_src: str) -> str:
        """Compile ``def FN(...)`` once per distinct source; return its name."""
        key = (kind, body_src)
        name = self.cache.get(key)
        if name is None:
            name = f"_{kind}{len(self.cache)}"
            src = body_src.replace("FN", name, 1)
            exec(compile(src, f"<kafka {self.prefix} {kind}>", "exec"), self.ns)
            self.cache[key] = name
        return name

    # -- decoding ---------------------------------------------------------

    def decoder(self, st: s.Struct, version: int, flexible: bool) -> str:
        cls_name = self.const(self.classes[st.name], f"C_{st.name}")
        lines = ["def FN(buf, pos):", "    end_buf = len(buf)"]
        args = []
        runs, tagged = _layout(st, version)
        for run in runs:
            if isinstance(run, list):  # consecutive fixed-width fields: one unpack
                codes = "".join(r.type.struct_code for r in run)
                unpack, _ = self.packer(codes)
                names = [f"v_{r.name}" for r in run]
                lhs = ", ".join(names) + ("," if len(names) == 1 else "")
                lines.append(f"    {lhs} = {unpack}(buf, pos)")
                lines.append(f"    pos += {_struct.calcsize('>' + codes)}")
                args.extend((r.name, f"v_{r.name}") for r in run)
            else:
                self.read_value(lines, "    ", run, version, flexible, f"v_{run.name}")
                args.append((run.name, f"v_{run.name}"))
        if flexible:
            for fl in tagged:
                lines.append(f"    v_{fl.name} = {self.fresh_default(fl)}")
                args.append((fl.name, f"v_{fl.name}"))
            lines.append("    unknown = None")
            lines.append("    ntags = buf[pos]")
            lines.append("    if ntags < 0x80:")
            lines.append("        pos += 1")
            lines.append("    else:")
            lines.append("        ntags, pos = _read_uvarint(buf, pos)")
            lines.append("    for _ in range(ntags):")
            lines.append("        tag, pos = _read_uvarint(buf, pos)")
            lines.append("        size, pos = _read_uvarint(buf, pos)")
            lines.append("        tag_end = pos + size")
            lines.append("        if tag_end > end_buf:")
            lines.append("            raise DecodeError('tagged field runs past the end')")
            kw = "if"
            for fl in tagged:
                lines.append(f"        {kw} tag == {fl.tag}:")
                self.read_value(lines, "            ", fl, version, flexible, f"v_{fl.name}")
                lines.append("            if pos != tag_end:")
                lines.append(f"                raise DecodeError('tagged field {fl.name} has the wrong size')")
                kw = "elif"
            if tagged:
                lines.append("        else:")
                lines.append("            if unknown is None:")
                lines.append("                unknown = {}")
                lines.append("            unknown[tag] = bytes(buf[pos:tag_end])")
            else:
                lines.append("        if unknown is None:")
                lines.append("            unknown = {}")
                lines.append("        unknown[tag] = bytes(buf[pos:tag_end])")
            lines.append("        pos = tag_end")
        call = ", ".join(f"{n}={v}" for n, v in args)
        lines.append(f"    obj = {cls_name}({call})")
        if flexible:
            lines.append("    if unknown is not None:")
            lines.append("        obj._unknown_tags = unknown")
        lines.append("    return obj, pos")
        return self.compile("dec", "\n".join(lines) + "\n")

    def fresh_default(self, fl: s.Field) -> str:
        t = fl.type
        if isinstance(t, s.Struct) and fl.default is s._UNSET:
            return f"{self.const(self.classes[t.name], 'C_' + t.name)}()"
        d = fl.default_value()
        if isinstance(d, list):
            return "[]"
        return self.const(d, "def")

    def read_value(self, lines, ind, fl: s.Field, version: int, flexible: bool, var: str) -> None:
        self.read_type(lines, ind, fl.type, version in fl.nullable, _compact(fl, version, flexible),
                       version, flexible, var, fl.name)

    def read_length(self, lines, ind, width_code: str, compact: bool, nullable: bool, var: str, what: str):
        """Read a length/count into ``var``; ``var`` is -1 for null."""
        if compact:
            lines.append(f"{ind}{var} = buf[pos] - 1")
            lines.append(f"{ind}if {var} < 0x7F:")
            lines.append(f"{ind}    pos += 1")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    {var}, pos = _read_uvarint(buf, pos)")
            lines.append(f"{ind}    {var} -= 1")
        else:
            unpack, _ = self.packer(width_code)
            lines.append(f"{ind}{var}, = {unpack}(buf, pos)")
            lines.append(f"{ind}pos += {_struct.calcsize('>' + width_code)}")
        if nullable:
            lines.append(f"{ind}if {var} < -1:")
        else:
            lines.append(f"{ind}if {var} < 0:")
        lines.append(f"{ind}    raise DecodeError('bad length {{}} of {what}'.format({var}))")

    def read_type(self, lines, ind, t, nullable, compact, version, flexible, var, what):
        if isinstance(t, s.Array):
            n = f"n_{var}"
            self.read_length(lines, ind, "i", compact, nullable, n, what)
            inner = ind
            if nullable:
                lines.append(f"{ind}if {n} == -1:")
                lines.append(f"{ind}    {var} = None")
                lines.append(f"{ind}else:")
                inner = ind + "    "
            lines.append(f"{inner}if {n} > end_buf - pos:")
            lines.append(f"{inner}    raise DecodeError('array {what} of {{}} items in {{}} bytes'.format({n}, end_buf - pos))")
            item = t.item
            if isinstance(item, s.Struct):
                dec = self.decoder(item, version, flexible)
                lines.append(f"{inner}{var} = []")
                lines.append(f"{inner}app = {var}.append")
                lines.append(f"{inner}for _ in range({n}):")
                lines.append(f"{inner}    x, pos = {dec}(buf, pos)")
                lines.append(f"{inner}    app(x)")
            elif item.name in _FIXED and item.name != "bool":
                code = item.struct_code
                lines.append(f"{inner}{var} = list(_unpack_from('>%d{code}' % {n}, buf, pos))")
                lines.append(f"{inner}pos += {item.size} * {n}")
            else:
                lines.append(f"{inner}{var} = []")
                lines.append(f"{inner}for _ in range({n}):")
                self.read_type(lines, inner + "    ", item, False, compact, version, flexible, "x", what)
                lines.append(f"{inner}    {var}.append(x)")
            return
        if isinstance(t, s.Struct):
            dec = self.decoder(t, version, flexible)
            if nullable:  # KIP-893: an int8, -1 null, 1 present
                lines.append(f"{ind}if pos >= end_buf:")
                lines.append(f"{ind}    raise DecodeError('truncated struct {what}')")
                lines.append(f"{ind}present = buf[pos]")
                lines.append(f"{ind}pos += 1")
                lines.append(f"{ind}if present == 0xFF:")
                lines.append(f"{ind}    {var} = None")
                lines.append(f"{ind}elif present == 1:")
                lines.append(f"{ind}    {var}, pos = {dec}(buf, pos)")
                lines.append(f"{ind}else:")
                lines.append(f"{ind}    raise DecodeError('bad presence byte {{}} of {what}'.format(present))")
                return
            lines.append(f"{ind}{var}, pos = {dec}(buf, pos)")
            return
        name = t.name
        if name in _FIXED:
            unpack, _ = self.packer(t.struct_code)
            lines.append(f"{ind}{var}, = {unpack}(buf, pos)")
            lines.append(f"{ind}pos += {t.size}")
        elif name == "uuid":
            lines.append(f"{ind}if pos + 16 > end_buf:")
            lines.append(f"{ind}    raise DecodeError('truncated uuid {what}')")
            lines.append(f"{ind}{var} = _UUID(bytes=bytes(buf[pos:pos + 16]))")
            lines.append(f"{ind}pos += 16")
        else:  # string, bytes, records
            n = f"n_{var}"
            self.read_length(lines, ind, "h" if name == "string" else "i", compact, nullable, n, what)
            inner = ind
            if nullable:
                lines.append(f"{ind}if {n} == -1:")
                lines.append(f"{ind}    {var} = None")
                lines.append(f"{ind}else:")
                inner = ind + "    "
            lines.append(f"{inner}e = pos + {n}")
            lines.append(f"{inner}if e > end_buf:")
            lines.append(f"{inner}    raise DecodeError('{what}: {{}} bytes declared, {{}} left'.format({n}, end_buf - pos))")
            if name == "string":
                lines.append(f"{inner}{var} = str(buf[pos:e], 'utf-8')")
            else:
                lines.append(f"{inner}{var} = bytes(buf[pos:e])")
            lines.append(f"{inner}pos = e")

    # -- encoding ---------------------------------------------------------

    def encoder(self, st: s.Struct, version: int, flexible: bool) -> str:
        lines = ["def FN(out, o):"]
        runs, tagged = _layout(st, version)
        for run in runs:
            if isinstance(run, list):  # consecutive fixed-width fields: one pack
                _, pack = self.packer("".join(r.type.struct_code for r in run))
                vals = ", ".join(f"o.{r.name}" for r in run)
                lines.append(f"    out += {pack}({vals})")
            else:
                self.write_value(lines, "    ", run, version, flexible, f"o.{run.name}", "out")
        if flexible:
            if not tagged:
                lines.append("    u = o._unknown_tags")
                lines.append("    if u is None:")
                lines.append("        out.append(0)")
                lines.append("    else:")
                lines.append("        _write_tags(out, sorted(u.items()))")
            else:
                lines.append("    tags = []")
                for fl in tagged:
                    t = fl.type
                    if isinstance(t, s.Struct) and fl.default is s._UNSET:
                        default = self.const(self.classes[t.name](), f"D_{t.name}")
                    else:
                        default = self.const(fl.default_value(), "def")
                    lines.append(f"    v = o.{fl.name}")
                    lines.append(f"    if v != {default}:")
                    lines.append("        t = bytearray()")
                    self.write_value(lines, "        ", fl, version, flexible, "v", "t")
                    lines.append(f"        tags.append(({fl.tag}, t))")
                lines.append("    u = o._unknown_tags")
                lines.append("    if u is not None:")
                lines.append("        tags.extend(u.items())")
                lines.append("        tags.sort()")
                lines.append("    _write_tags(out, tags)")
        lines.append("    return out")
        return self.compile("enc", "\n".join(lines) + "\n")

    def write_value(self, lines, ind, fl: s.Field, version, flexible, expr, out):
        self.write_type(lines, ind, fl.type, version in fl.nullable, _compact(fl, version, flexible),
                        version, flexible, expr, out, fl.name)

    def write_length(self, lines, ind, width_code, compact, n_expr, out):
        if compact:
            lines.append(f"{ind}n = {n_expr} + 1")
            lines.append(f"{ind}if n < 128:")
            lines.append(f"{ind}    {out}.append(n)")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    _write_uvarint({out}, n)")
        else:
            _, pack = self.packer(width_code)
            lines.append(f"{ind}{out} += {pack}({n_expr})")

    def write_null(self, lines, ind, width, compact, out):
        if compact:
            lines.append(f"{ind}{out}.append(0)")
        else:
            lines.append(f"{ind}{out} += {bytes([255]) * width!r}")

    def write_type(self, lines, ind, t, nullable, compact, version, flexible, expr, out, what):
        var = f"w{len(ind)}"
        lines.append(f"{ind}{var} = {expr}")
        if isinstance(t, s.Struct):
            enc = self.encoder(t, version, flexible)
            if nullable:  # KIP-893: an int8 presence marker, -1 for null
                lines.append(f"{ind}if {var} is None:")
                lines.append(f"{ind}    {out}.append(0xFF)")
                lines.append(f"{ind}else:")
                lines.append(f"{ind}    {out}.append(1)")
                lines.append(f"{ind}    {enc}({out}, {var})")
                return
            lines.append(f"{ind}{enc}({out}, {var})")
            return
        if isinstance(t, s.Primitive) and t.name in _FIXED:
            _, pack = self.packer(t.struct_code)
            lines.append(f"{ind}{out} += {pack}({var})")
            return
        if isinstance(t, s.Primitive) and t.name == "uuid":
            lines.append(f"{ind}{out} += {var}.bytes")
            return
        inner = ind
        lines.append(f"{ind}if {var} is None:")
        if nullable:
            width = 2 if isinstance(t, s.Primitive) and t.name == "string" else 4
            self.write_null(lines, ind + "    ", width, compact, out)
        else:
            lines.append(f"{ind}    raise EncodeError('{what} is not nullable in this version')")
        lines.append(f"{ind}else:")
        inner = ind + "    "
        if isinstance(t, s.Array):
            self.write_length(lines, inner, "i", compact, f"len({var})", out)
            item = t.item
            if isinstance(item, s.Struct):
                enc = self.encoder(item, version, flexible)
                lines.append(f"{inner}for x in {var}:")
                lines.append(f"{inner}    {enc}({out}, x)")
            elif item.name in _FIXED and item.name != "bool":
                lines.append(f"{inner}{out} += _pack('>%d{item.struct_code}' % len({var}), *{var})")
            else:
                lines.append(f"{inner}for x in {var}:")
                self.write_type(lines, inner + "    ", item, False, compact, version, flexible, "x", out, what)
            return
        if t.name == "string":
            lines.append(f"{inner}b = {var}.encode()")
            lines.append(f"{inner}if len(b) > 0x7FFF:")
            lines.append(f"{inner}    raise EncodeError('{what} longer than 32767 bytes')")
            self.write_length(lines, inner, "h", compact, "len(b)", out)
            lines.append(f"{inner}{out} += b")
        else:  # bytes, records: any bytes-like object of bytes
            self.write_length(lines, inner, "i", compact, f"len({var})", out)
            lines.append(f"{inner}{out} += {var}")


def _write_tags(out: bytearray, tags) -> bytearray:
    write_uvarint(out, len(tags))
    for tag, data in tags:
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data
    return out


# --------------------------------------------------------------------------
# Building the message classes
# --------------------------------------------------------------------------

_NS: dict = {
    "_MISSING": _MISSING, "_UUID": _uuid.UUID, "DecodeError": DecodeError,
    "EncodeError": EncodeError, "_read_uvarint": read_uvarint, "_write_uvarint": write_uvarint,
    "_write_tags": _write_tags, "_unpack_from": _struct.unpack_from, "_pack": _struct.pack,
}
_CACHE: dict = {}

_DECODE_ERRORS = (_struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError)


def _structs(st: s.Struct):
    """Every struct reachable from ``st``, children first."""
    for fl in st.fields:
        t = fl.type
        if isinstance(t, s.Array) and isinstance(t.item, s.Struct):
            yield from _structs(t.item)
        elif isinstance(t, s.Struct):
            yield from _structs(t)
    yield st


class _Compiled(dict):
    """version -> generated function, compiled on first use of that version.

    Compiling every declared version of every message at import costs about
    0.3 s (some 700 functions); a connection uses a handful of them, so each
    is written and compiled when a version is first asked for, then kept.
    """

    def __init__(self, msg: s.Message, make):
        super().__init__()
        self._msg = msg
        self._make = make

    def __missing__(self, version):
        if version not in self._msg.valid:
            return None
        fn = self[version] = self._make(version)
        return fn


def build(msg: s.Message) -> type:
    """The message class of ``msg``, with its generated ``decode`` and ``encode``.

    Every declared message is built at import (``MESSAGES``); this is public
    so that tests can build declarations of their own.
    """
    classes: dict[str, type] = {}
    seen: dict[str, s.Struct] = {}
    for st in _structs(msg.body):
        if st.name in seen:
            assert seen[st.name] == st, f"{msg.name}: two different structs named {st.name}"
            continue
        seen[st.name] = st
        classes[st.name] = _make_class(st, classes, _NS)
    cls = classes[msg.name]
    for name, c in classes.items():
        if name != msg.name:
            assert not hasattr(cls, name), f"{msg.name}: struct {name} hides an attribute"
            c.__qualname__ = f"{msg.name}.{name}"
            setattr(cls, name, c)
    gen = _Generator(_NS, _CACHE, classes, msg.name)
    decoders = _Compiled(msg, lambda v: _NS[gen.decoder(msg.body, v, msg.is_flexible(v))])
    encoders = _Compiled(msg, lambda v: _NS[gen.encoder(msg.body, v, msg.is_flexible(v))])
    cls.NAME = msg.name
    cls.API_KEY = msg.api_key
    cls.VERSIONS = msg.valid
    cls.FLEXIBLE = msg.flexible
    cls.SCHEMA = msg
    cls._decoders = decoders
    cls._encoders = encoders
    cls.decode = classmethod(_decode)
    cls.decode_from = classmethod(_decode_from)
    cls.encode = _encode
    cls.encode_into = _encode_into
    return cls


def _decode(cls, data, version: int):
    """Decode exactly ``data`` (bytes-like) as this message at ``version``.

    Raises:
        DecodeError: bad or truncated input, trailing bytes, unknown version.
    """
    obj, pos = cls.decode_from(data, 0, version)
    if pos != len(data):
        raise DecodeError(f"{cls.NAME} v{version}: {len(data) - pos} bytes left over")
    return obj


def _decode_from(cls, buf, pos: int, version: int):
    """Decode this message from ``buf`` at ``pos``; returns ``(obj, end position)``."""
    dec = cls._decoders[version]
    if dec is None:
        raise DecodeError(f"{cls.NAME} has no version {version}")
    try:
        return dec(buf, pos)
    except DecodeError as e:
        raise DecodeError(f"{cls.NAME} v{version}: {e}") from None
    except _DECODE_ERRORS as e:
        raise DecodeError(f"{cls.NAME} v{version}: {type(e).__name__}: {e}") from None


def _encode(self, version: int) -> bytes:
    """The wire bytes of this message at ``version`` (no size prefix, no header)."""
    return bytes(self.encode_into(bytearray(), version))


def _encode_into(self, out: bytearray, version: int) -> bytearray:
    """Append the encoding to ``out``; returns ``out``.

    Raises:
        EncodeError: a value the version cannot carry (null where not nullable, too long).
    """
    enc = self._encoders[version]
    if enc is None:
        raise EncodeError(f"{self.NAME} has no version {version}")
    try:
        return enc(out, self)
    except EncodeError as e:
        raise EncodeError(f"{self.NAME} v{version}: {e}") from None
    except (_struct.error, AttributeError, TypeError, ValueError) as e:
        # a value of the wrong type or range, a string that is not UTF-8 encodable
        raise EncodeError(f"{self.NAME} v{version}: {type(e).__name__}: {e}") from None


MESSAGES: dict[str, type] = {}
REQUESTS: dict[int, type] = {}
RESPONSES: dict[int, type] = {}

for _msg in list(s.HEADERS.values()) + list(s.REQUESTS.values()) + list(s.RESPONSES.values()):
    _cls = build(_msg)
    MESSAGES[_msg.name] = _cls
    globals()[_msg.name] = _cls
    if _msg.kind == "request":
        REQUESTS[_msg.api_key] = _cls
    elif _msg.kind == "response":
        RESPONSES[_msg.api_key] = _cls
del _msg, _cls

__all__ += sorted(n for n in MESSAGES if n not in __all__)

RequestHeader = MESSAGES["RequestHeader"]
ResponseHeader = MESSAGES["ResponseHeader"]
