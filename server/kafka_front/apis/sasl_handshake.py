"""SaslHandshake (key 17): the client names its SASL mechanism.

Versions 0-1. The answer lists the mechanisms served (PLAIN,
SCRAM-SHA-256); one not among them is answered UNSUPPORTED_SASL_MECHANISM
and the connection closes. After v1 the tokens come in SaslAuthenticate
requests, after v0 bare (an int32 size and the token). Once authenticated:
ILLEGAL_SASL_STATE (no re-authentication). ``server.kafka_front.sasl``
keeps the state.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka_front.sasl import MECHANISMS

API_KEY = 17
NAME = "SaslHandshake"
VERSIONS = (0, 1)

R = codec.SaslHandshakeResponse


async def handle(ctx, req):
    code = ctx.sasl.handshake(req.body.mechanism, req.api_version)
    return R(error_code=code, mechanisms=list(MECHANISMS))
