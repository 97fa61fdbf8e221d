"""The Kafka wire protocol, sans-IO: message declarations, generated codecs, framing, record batches.

Owns: ``schema`` (what each message looks like, per version), ``codec``
(encoders, decoders and message classes generated from it), ``framing``
(frames, headers, what a broker does with requests it does not serve),
``records`` (record batch v2) and ``errors`` (Kafka's error codes).

Must not know: sockets, trio, the broker. Not served yet: no listener uses
this package (docs/kafka.md).
"""
