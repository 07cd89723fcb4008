"""hivemind's framing of a protobuf stream (a marker byte, the length in 8 bytes, the message),
read with a bound.

hivemind's own reader of a stream takes a message of any length it is announced, so a peer at
the other end could make it hold whatever that peer cares to send. The checkpoint stream
(transfer.py) is read through `read_frame` at both ends instead. Unary calls pass through the
libp2p daemon, which caps them at 4 MiB.
"""

from __future__ import annotations

import asyncio

from hivemind.p2p import P2P


class FramingError(Exception):
    """A frame that is not one, or that announces more bytes than the reader takes."""


async def read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[bool, bytes]:
    """The next frame on `reader`: whether it is an error reply, and its bytes. FramingError if
    it announces more than `limit` bytes (before reading them) or has no known marker;
    asyncio.IncompleteReadError where the stream ends."""
    marker = await reader.readexactly(1)
    if marker not in (P2P.MESSAGE_MARKER, P2P.ERROR_MARKER):
        raise FramingError("sent a frame with no known marker")
    length = int.from_bytes(await reader.readexactly(P2P.HEADER_LEN), P2P.BYTEORDER)
    if length > limit:
        raise FramingError(f"announced a message of {length} bytes, more than the {limit} taken")
    return marker == P2P.ERROR_MARKER, await reader.readexactly(length)
