"""``mc0 journal copy``: a file journal's records into the JetStream stream of a journal, seqs kept.

Contract: ``copy_journal(config, name, folder)`` reads the file journal in
``folder`` (stop its broker first: opening it truncates a torn tail) and
publishes its records, in seq order, into the stream of ``[journals.NAME]``
(which must say ``store = "jetstream"``), straight to NATS with the
``[cluster]`` credentials: each record at the seq it had, its time of
arrival aside (JetStream stamps its own).  The stream is created if it is
not there (the journal's config), and numbered to begin where the file
journal begins (an empty stream is purged up to that seq); every record is
published with ``Nats-Expected-Last-Sequence`` (so no number can slip) and
a ``Nats-Msg-Id``.  A run that stopped half way is run again: it goes on
after the stream's last seq.  A stream that already holds other records
(seqs that cannot line up), a gap in the file journal (a lost segment) and
a journal that keeps mailboxes (letters are delivered, not copied) are
errors saying so; nothing is published then.  A record larger than the NATS
servers' ``max_payload`` (its headers counted) stops the copy before it, in
one line naming the limit (sent, the server would close the connection).  Durable consumers are not
copied: create them again on the new journal (``deliver`` all, or ack up to
where they stood).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, Error
from ...protocol import jetstream as jsw
from ...protocol.journalrecords import encode_payload
from ...settings import Config
from ..cluster.link import nats_options
from ..storage.filestore import Journal
from .linkpart import message_size, too_large
from .streams import StoreError, api, spec_of

log = logging.getLogger("mc0.journal")

WINDOW = 256  # publishes in flight
PAGE = 1000


@dataclass(frozen=True)
class Copied:
    stream: str
    first: int  # the first seq copied (0: none)
    last: int
    records: int
    already: int  # records the stream held from an earlier run


def copy_journal(config: Config, name: str, folder: str, *, progress: Callable[[int], None] | None = None) -> Copied:
    settings = config.journals.get(name)
    if settings is None:
        known = ", ".join(sorted(config.journals)) or "none"
        raise ConfigError(f"journals.{name}", f"no such journal in the config (journals: {known})")
    if not settings.replicated:
        raise ConfigError(f"journals.{name}.store", 'must be "jetstream": the copy goes into its JetStream stream')
    if settings.mailboxes:
        raise ConfigError(f"journals.{name}.mailboxes", "a journal of letters is not copied: its broker delivers them")
    if not config.cluster.nats:
        raise ConfigError("cluster.nats", "the NATS servers of the stream are needed")
    source = Journal(name, settings.__class__(folder=folder, fsync="never", dedup_window_s=0))
    try:
        source.open()
    except OSError as exc:
        raise Error(f"cannot open the file journal in {folder}: {exc}") from None
    try:
        return asyncio.run(_copy(config, name, source, progress))
    finally:
        source.close()


async def _copy(config: Config, name: str, source: Journal, progress: Callable[[int], None] | None) -> Copied:
    import nats

    spec = spec_of(name, config.journals[name], config)
    stream = jsw.stream_name(name)
    try:
        nc = await asyncio.wait_for(nats.connect(**nats_options(config.cluster, f"mc0-journal-copy-{name}")), 15)
    except Exception as exc:
        raise Error(f"no NATS server of [cluster] nats answers: {type(exc).__name__}: {exc}") from None
    try:
        first, last = await _stream_for(nc, stream, spec.config(), source.first_seq)
        start = max(source.first_seq, last + 1)
        if last >= first and not await _copied_here(nc, stream, name, last):
            raise Error(
                f"stream {stream} holds seqs {first}..{last} that are not this copy's: copy into a stream "
                "of its own (a new journal name), before any broker writes to it"
            )
        if last + 1 < source.first_seq:
            raise Error(f"stream {stream} ends at seq {last}, before the file journal's first {source.first_seq}")
        already = max(0, min(last, source.next_seq - 1) - source.first_seq + 1) if last >= source.first_seq else 0
        copied = await _publish(nc, name, source, start, progress)
        return Copied(stream, start if copied else 0, start + copied - 1 if copied else 0, copied, already)
    except StoreError as exc:
        raise Error(f"JetStream: {exc.description}") from None
    finally:
        await nc.close()


async def _copied_here(nc: Any, stream: str, name: str, seq: int) -> bool:
    """The stream's record at ``seq`` is the one an earlier run of this copy put there."""
    try:
        message = await nc.jetstream(timeout=10).get_msg(stream, seq)
    except Exception as exc:
        raise Error(f"stream {stream}: cannot read seq {seq}: {type(exc).__name__}: {exc}") from None
    return (message.headers or {}).get(jsw.MSG_ID) == f"copy:{name}:{seq}"


async def _stream_for(nc: Any, stream: str, config: dict[str, Any], first_seq: int) -> tuple[int, int]:
    """The stream (created with the journal's config if absent): its (first seq, last seq), an empty
    one numbered to begin at ``first_seq``."""
    try:
        info = await api(nc, f"STREAM.INFO.{stream}")
    except StoreError as exc:
        if exc.code != 404:
            raise
        info = await api(nc, f"STREAM.CREATE.{stream}", {**config, "first_seq": first_seq})
    state = info["state"]
    first, last = int(state["first_seq"]), int(state["last_seq"])
    if int(state.get("messages", 0)) == 0 and last + 1 != first_seq and last < first_seq:
        await api(nc, f"STREAM.PURGE.{stream}", {"seq": first_seq})  # the next record gets first_seq
        info = await api(nc, f"STREAM.INFO.{stream}")
        first, last = int(info["state"]["first_seq"]), int(info["state"]["last_seq"])
    return first, last


async def _publish(nc: Any, name: str, source: Journal, start: int, progress: Callable[[int], None] | None) -> int:
    """Publish the file journal's records from ``start`` on, ``WINDOW`` in flight, each where it must land."""
    js = nc.jetstream(timeout=10)
    copied = 0
    expected = start
    cursor = start
    while cursor < source.next_seq:
        records, cursor = source.read(cursor, max_records=PAGE, max_bytes=8 << 20)
        for begin in range(0, len(records), WINDOW):
            window = records[begin : begin + WINDOW]
            sent = []
            too_big = ""
            for record in window:
                if record.seq != expected:
                    gap = f"the file journal has a gap before seq {record.seq} (a segment lost)"
                    raise Error(f"{gap}: copied up to {expected - 1}")
                headers = {
                    jsw.MSG_ID: f"copy:{name}:{record.seq}",
                    "Nats-Expected-Last-Sequence": str(record.seq - 1),
                }
                payload = encode_payload(record.topic, record.sender, record.headers, record.parts)
                size = message_size(payload, headers)
                if size > nc.max_payload:  # (sent, the server would close the connection: never stored)
                    too_big = f"seq {record.seq}: {too_large(size, nc.max_payload)}: copied up to {record.seq - 1}"
                    break  # (what was sent before it is confirmed first)
                try:
                    sent.append(await js.publish_async(jsw.subject(name, record.topic), payload, headers=headers))
                except Exception as exc:  # (nats-py's buffer full while reconnecting, the connection closed)
                    raise Error(
                        f"seq {record.seq} not sent ({type(exc).__name__}: {exc}): copied up to {record.seq - 1}"
                        " at most; run it again to go on"
                    ) from None
                expected += 1
            for record, future in zip(window[: len(sent)], sent, strict=True):
                try:
                    ack = await asyncio.wait_for(future, 30)
                except Exception as exc:
                    raise Error(
                        f"seq {record.seq} not stored ({type(exc).__name__}: {exc}): copied up to {record.seq - 1}"
                    ) from None
                if ack.seq != record.seq:
                    raise Error(f"seq {record.seq} landed at {ack.seq} in the stream: stopped")
            copied += len(sent)
            if progress is not None:
                progress(copied)
            if too_big:
                raise Error(too_big)
    return copied


def summary(done: Copied, folder: str, name: str) -> str:
    if not done.records:
        return f"nothing to copy: stream {done.stream} already holds the {done.already} records of {folder}"
    text = f"copied {done.records} records (seq {done.first}..{done.last}) of {folder} into stream {done.stream}"
    return text + (f" ({done.already} were there from an earlier run)" if done.already else "")


__all__ = ["Copied", "copy_journal", "summary"]
