"""What every group API checks first: that this node coordinates the group, and the user's right.

Owns: ``refusal`` (NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED or None).

Must not know: the group protocol's states (``groups``), the wire format.
"""

from __future__ import annotations

from typing import Any

from server.kafka import errors as E
from server.kafka_front import access


def refusal(ctx: Any, group_id: str, command: str = access.GROUP_READ) -> int | None:
    """The error a request about ``group_id`` gets before anything else, or None."""
    if not access.group_allowed(ctx, command):
        return E.GROUP_AUTHORIZATION_FAILED
    if not ctx.front.coordinates(ctx, group_id):
        return E.NOT_COORDINATOR
    return None
