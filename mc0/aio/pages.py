"""A journal fetch read page by page as columns: ``Client.fetch_pages`` returns a :class:`PageStream`.

Contract: the fetch asks the broker for ``columns/1`` pages, and each page is
handed out as it arrives, checked whole (:func:`mc0.protocol.parse_columns_page`)
and not turned into Record objects (``page.records()`` does that on demand),
while the broker keeps streaming the next ones (paced by its window), so
the reader decodes one page while the next is on the wire; ``next_pages``
takes every page already received at once.  A broker from
before columns pages answers with JSON pages; they are converted, so the
reader sees the same pages either way.  A malformed page ends the stream
(CANCEL) and raises ``ValueError``; the broker's ERROR raises as for any
request (``Gone`` for a trimmed range).  ``next_seq``, ``first_seq`` and
``end_seq`` are the FINAL's, set once the stream ended.
"""

from __future__ import annotations

import json

from .. import protocol as P
from ..message import Reply
from ..protocol import ColumnsPage
from .replies import ReplyStream


class PageStream:
    """The pages of one ``columns/1`` fetch (async iterator of :class:`~mc0.protocol.ColumnsPage`)."""

    def __init__(self, stream: ReplyStream) -> None:
        self._stream = stream
        self.next_seq: int | None = None  # where to continue: set by the FINAL
        self.first_seq: int | None = None
        self.end_seq: int | None = None
        self.records = 0  # records handed out so far
        self._failed: Exception | None = None  # raised by the next next_pages() call

    @property
    def done(self) -> bool:
        return self.next_seq is not None

    def __aiter__(self) -> PageStream:
        return self

    async def __anext__(self) -> ColumnsPage:
        reply = await self._stream.__anext__()  # StopAsyncIteration after the FINAL, the broker's ERROR raises
        if reply.final:
            self._finished(reply)
            raise StopAsyncIteration
        try:
            page = page_of(reply.parts)
        except ValueError:
            await self._stream.close()
            raise
        self.records += page.count
        return page

    async def next_pages(self) -> list[ColumnsPage]:
        """The next page and every page already received after it; ``[]`` once the fetch ended.

        A sync reader takes pages this way, one hand-over between threads for
        all that arrived while it was busy; a failure after some pages is
        raised by the next call, after those pages.
        """
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        pages: list[ColumnsPage] = []
        try:
            pages.append(await self.__anext__())
            while self._stream.queued:
                pages.append(await self.__anext__())
        except StopAsyncIteration:
            pass
        except Exception as exc:
            if not pages:
                raise
            self._failed = exc
        return pages

    def _finished(self, final: Reply) -> None:
        try:
            summary = json.loads(final.body)
            self.first_seq = int(summary["first_seq"])
            self.end_seq = int(summary["end_seq"])
            self.next_seq = int(summary["next_seq"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed fetch summary: {exc}") from None

    async def close(self) -> None:
        """Stop the fetch (CANCEL) if it has not ended; idempotent."""
        await self._stream.close()

    async def __aenter__(self) -> PageStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def page_of(parts: tuple[bytes, ...]) -> ColumnsPage:
    """A PARTIAL's body as a columns page: parsed, or converted from an old broker's JSON page."""
    if parts and P.is_columns_page(parts[0]):
        if len(parts) != 1:
            raise ValueError(f"malformed columns page: {len(parts)} frames, not 1")
        return P.parse_columns_page(parts[0])
    records = P.parse_journal_page(parts)
    next_seq = records[-1].seq + 1 if records else 0
    return P.parse_columns_page(P.columns_page(P.page_columns(records), next_seq))
