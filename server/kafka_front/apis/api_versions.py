"""ApiVersions (key 18): the APIs and versions this broker serves, exactly.

Versions 0-3 (4 is answered by the framing with UNSUPPORTED_VERSION and
ApiVersions' own range, and the client retries at 3: KIP-511). No
supported or finalized features are advertised.
"""

from __future__ import annotations

from server.kafka import codec

API_KEY = 18
NAME = "ApiVersions"
VERSIONS = (0, 3)

R = codec.ApiVersionsResponse


async def handle(ctx, req):
    return R(api_keys=[R.ApiVersion(api_key=key, min_version=lo, max_version=hi)
                       for key, (lo, hi) in ctx.front.served.items()])
