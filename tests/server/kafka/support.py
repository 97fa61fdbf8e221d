"""Helpers of the Kafka codec tests: hypothesis strategies built from the declarations, and
conversions to and from kafka-python's message objects (the independent encoder)."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

from server.kafka import codec, schema

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1),
}


def _classes(cls) -> dict[str, type]:
    """Struct name -> generated class, for a message class and its nested structs."""
    out = {cls.SCHEMA.body.name: cls}
    for name in dir(cls):
        c = getattr(cls, name)
        if isinstance(c, type) and issubclass(c, codec.KafkaMessage) and c is not cls:
            out[name] = c
    return out


def _primitive(t: schema.Primitive, nullable: bool):
    name = t.name
    if name in _INT_RANGES:
        lo, hi = _INT_RANGES[name]
        s = st.integers(lo, hi)
    elif name == "bool":
        s = st.booleans()
    elif name == "float64":
        s = st.floats(allow_nan=False)
    elif name == "uuid":
        s = st.binary(min_size=16, max_size=16).map(lambda b: uuid.UUID(bytes=b))
    elif name == "string":
        s = st.text(max_size=12)
    else:  # bytes, records
        s = st.binary(max_size=24)
    return st.one_of(st.none(), s) if nullable else s


def message_values(cls, version: int, *, unknown_tags: bool = True, max_items: int = 3):
    """Instances of message class ``cls`` that are valid at ``version``.

    Fields absent at that version keep their defaults (a decoder gives them
    their defaults too), so a round trip must return an equal object.
    """
    msg = cls.SCHEMA
    classes = _classes(cls)
    flexible = msg.is_flexible(version)

    def struct_of(struct: schema.Struct):
        fields = {}
        tags_used = set()
        for fl in struct.fields:
            if not fl.present_in(version):
                continue
            if fl.is_tagged_in(version):
                tags_used.add(fl.tag)
            fields[fl.name] = type_of(fl.type, version in fl.nullable)
        base = st.fixed_dictionaries(fields).map(lambda kw, c=classes[struct.name]: c(**kw))
        if not (flexible and unknown_tags):
            return base
        tag_values = st.dictionaries(
            st.integers(0, 300).filter(lambda t: t not in tags_used), st.binary(max_size=6), max_size=2)

        def with_tags(obj, tags):
            if tags:
                obj._unknown_tags = dict(sorted(tags.items()))
            return obj
        return st.builds(with_tags, base, tag_values)

    def type_of(t, nullable):
        if isinstance(t, schema.Array):
            items = st.lists(type_of(t.item, False), max_size=max_items)
            return st.one_of(st.none(), items) if nullable else items
        if isinstance(t, schema.Struct):
            return st.one_of(st.none(), struct_of(t)) if nullable else struct_of(t)
        return _primitive(t, nullable)

    return struct_of(msg.body)


def version_dict(obj, version: int):
    """The fields of ``obj`` present at ``version``, as plain data (zero UUID as None, a default
    tagged struct as None: kafka-python's conventions)."""
    def conv(struct: schema.Struct, o):
        out = {}
        for fl in struct.fields:
            if not fl.present_in(version):
                continue
            out[fl.name] = value(fl.type, getattr(o, fl.name), fl)
        return out

    def value(t, v, fl=None):
        if v is None:
            return None
        if isinstance(t, schema.Array):
            return [value(t.item, x) for x in v]
        if isinstance(t, schema.Struct):
            if fl is not None and fl.is_tagged_in(version) and v == type(v)():
                return None
            return conv(t, v)
        if isinstance(v, uuid.UUID) and v.int == 0:
            return None
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        return v

    return conv(obj.SCHEMA.body, obj)


def _is_ops(fl: schema.Field) -> bool:
    return fl.name.endswith("authorized_operations") and fl.type is schema.INT32


def _kp_name(fl: schema.Field) -> str:
    # kafka-python renames Cluster/TopicAuthorizedOperations to authorized_operations.
    return "authorized_operations" if _is_ops(fl) else fl.name


def _ops_to_kp(v: int):
    """kafka-python holds an authorized-operations int32 as the set of its bits (None for {31})."""
    bits = {i for i in range(32) if (v & 0xFFFFFFFF) >> i & 1}
    return None if bits == {31} else bits


def _ops_from_kp(bits) -> int:
    u = sum(1 << i for i in ({31} if bits is None else bits))
    return u - (1 << 32) if u & 0x80000000 else u


def _is_default_tagged(fl: schema.Field, version: int, v) -> bool:
    if not fl.is_tagged_in(version):
        return False
    if isinstance(fl.type, schema.Struct):
        return v == type(v)()
    return v == fl.default_value()


def to_kafka_python(kcls, obj, version: int):
    """kafka-python's object for ``obj`` (a codec message) at ``version``.

    Tagged fields equal to their default are left out: kafka-python writes a
    tagged field whenever it is passed, Kafka (and this codec) only when it
    differs from its default.
    """
    def build(kstruct, data_class, struct: schema.Struct, o, top):
        kw = {}
        for fl in struct.fields:
            if not fl.present_in(version):
                continue
            v = getattr(o, fl.name)
            if _is_default_tagged(fl, version, v):
                continue
            name = _kp_name(fl)
            kw[name] = convert(kstruct.fields[name], fl, fl.type, v)
        if top:
            return data_class(version=version, **kw)
        return data_class(**kw)

    def convert(kf, fl, t, v):
        if v is None:
            return None
        if isinstance(t, schema.Array) and isinstance(t.item, schema.Struct):
            return [build(kf, kf.data_class, t.item, x, False) for x in v]
        if isinstance(t, schema.Struct):
            return build(kf, kf.data_class, t, v, False)
        if isinstance(v, uuid.UUID) and v.int == 0:
            return None
        if _is_ops(fl):
            return _ops_to_kp(v)
        return v

    return build(kcls._struct, kcls, obj.SCHEMA.body, obj, True)


def kafka_python_dict(kobj, cls, version: int):
    """kafka-python's decoded object as plain data comparable with ``version_dict``."""
    def conv(struct: schema.Struct, d):
        out = {}
        for fl in struct.fields:
            if not fl.present_in(version):
                continue
            v = d[_kp_name(fl)]
            out[fl.name] = _ops_from_kp(v) if _is_ops(fl) else value(fl.type, v)
        return out

    def value(t, v):
        if v is None:
            return None
        if isinstance(t, schema.Array):
            return [value(t.item, x) for x in v]
        if isinstance(t, schema.Struct):
            return conv(t, v)
        if isinstance(v, uuid.UUID) and v.int == 0:
            return None
        if isinstance(v, (bytearray, memoryview)):
            return bytes(v)
        return v

    return conv(cls.SCHEMA.body, kobj.to_dict(json=False))


def kafka_python_classes() -> dict[str, type]:
    """kafka-python's message classes by Kafka message name."""
    import importlib
    import pkgutil

    import kafka.protocol
    from kafka.protocol.api_message import ApiMessage

    for m in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        importlib.import_module(m.name)

    def subclasses(c):
        for sub in c.__subclasses__():
            yield sub
            yield from subclasses(sub)

    out = {}
    for c in subclasses(ApiMessage):
        if getattr(c, "_class_version", None) is None and getattr(c, "_json", None):
            out.setdefault(c._json["name"], c)
    return out
