"""SaslAuthenticate (key 36): one token of the SASL exchange each way.

Versions 0-2 (v1 adds the session lifetime: always 0, no
re-authentication; v2 is flexible). A failed authentication is answered
SASL_AUTHENTICATION_FAILED with Kafka's message, then the connection
closes; once authenticated, ILLEGAL_SASL_STATE. ``server.kafka_front.sasl``
runs the mechanisms.
"""

from __future__ import annotations

from server.kafka import codec

API_KEY = 36
NAME = "SaslAuthenticate"
VERSIONS = (0, 2)

R = codec.SaslAuthenticateResponse


async def handle(ctx, req):
    code, message, token = ctx.sasl.authenticate(req.body.auth_bytes)
    return R(error_code=code, error_message=message, auth_bytes=token)
