"""The Redis stream model on top of the partition log (above ``storage.log``,
below ``cluster``/``server``): IDs (``ids``) and streams (``stream``)."""

from storage.streams.ids import MAX_ID, MIN_ID, StreamId, StreamIdError
from storage.streams.stream import Entries, Stream, StreamError

__all__ = ["MAX_ID", "MIN_ID", "Entries", "Stream", "StreamError", "StreamId", "StreamIdError"]
