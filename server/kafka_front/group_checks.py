"""What every group API checks first (that this node coordinates the group, the user's right), and how its writes are answered.

Owns: ``refusal`` (NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED or None),
``write_error`` (the error of a refused write of committed offsets) and
``answer_when_written`` (a response held until the request's writes are
durable and replicated).

Must not know: the group protocol's states (``groups``), the wire format.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from cluster.errors import Moved
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.context import Pending

log = logging.getLogger("partita.kafka")

COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms


def refusal(ctx: Any, group_id: str, command: str = access.GROUP_READ) -> int | None:
    """The error a request about ``group_id`` gets before anything else, or None."""
    if not access.group_allowed(ctx, command):
        return E.GROUP_AUTHORIZATION_FAILED
    if not ctx.front.coordinates(ctx, group_id):
        return E.NOT_COORDINATOR
    return None


def write_error(exc: BaseException) -> int:
    """The Kafka error of a group write the broker refused."""
    return E.NOT_COORDINATOR if isinstance(exc, Moved) else E.COORDINATOR_NOT_AVAILABLE


def answer_when_written(ctx: Any, response: Any, fail: Callable[[int], None], what: str, group: str) -> Any:
    """``response`` once the writes this request made are durable and replicated (a ``Pending``);
    if they cannot be acknowledged, ``fail(error)`` first marks what it covers."""
    receipt = ctx.session.take_receipt()
    if receipt is None:
        return response

    def finish(error: BaseException | None) -> Any:
        if error is not None:
            log.error("Kafka group '%s': %s not acknowledged: %s", group, what, error)
            fail(E.REQUEST_TIMED_OUT if isinstance(error, TimeoutError) else E.COORDINATOR_NOT_AVAILABLE)
        return response

    return Pending(receipt, COMMIT_TIMEOUT_MS, finish)
