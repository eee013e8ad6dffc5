"""StoreOps: the store calls the core makes (durable consumers, mailboxes), done with the JetStream API.

Contract: each ``op_<name>(request)`` coroutine does one call the core asked
(:mod:`.storecalls`) and returns ``(data, payloads)``: the
answer's JSON and the payloads of the records it carries (their ``[seq, ts
ns]`` in ``data["records"]``, in the same order); a failure raises
:class:`~.streams.StoreError` with mc0's status.  Ops:

- ``consumer_lookup`` {journal, name, owner}: ``{"info"}`` when it exists, else
  ``{"owned", "total"}``: mc0 consumers of that owner / of anyone, over every
  JetStream journal's stream (the quotas are the core's to apply);
- ``consumer_create`` {journal, name, owner, config, replicas}: a durable pull
  consumer (explicit acks, the filter subjects of its topics, no delivery
  bound: mc0 dead-letters), owner and config in its metadata: ``{"info"}``;
- ``consumer_info`` / ``consumer_delete`` / ``consumer_list`` {journals, owner};
- ``consumer_report`` {journals}: ``{"consumers"}``, each mc0 consumer with JetStream's
  figures (num_pending, num_ack_pending, ack_floor, ...) for /consumerz;
- ``consumer_pull`` {journal, name, batch, wait_ms}: what is there now, else a
  long poll for one record, then what came with it: ``{"records",
  "deliveries"}`` (a long poll for one never leaves records delivered to
  nobody);
- ``consumer_settle`` {journal, name, how, seqs, delay_ms}: ack/nak/term each
  seq on its ack subject (the one this broker pulled it with, or one made from
  the stream seq when another broker did: JetStream matches an ack or term by
  the stream seq, and a nak also wants a consumer seq not below its floor,
  which the consumer's delivered seq is); ``{"done", "ignored"}`` (ignored:
  JetStream did not confirm it within a second, or it cannot be pending: at or
  below the ack floor, past the last delivered, acked or terminated through
  this broker already; JetStream answers an ack of a seq not pending as it
  answers any, so one settled through another broker above the floor is
  counted again).  At most ``SETTLE_WORKERS``
  acks of one settle, and ``MAX_REQUESTS`` of all, are in flight at once.
- ``consumer_list_all`` {journals}: every mc0 consumer of them, whoever owns it:
  ``{"consumers": [[journal, name, info]...]}``;
- ``stream_purge`` {journal}: every record the stream holds goes (``seq``: up to
  the last one now, so what is published meanwhile stays): ``{"purged",
  "first_seq"}``;
- ``letters_read`` {journal, identity, after}: the identity's letters in order,
  those past seq ``after`` (0 when not given; a batched direct get on its
  subject: any replica answers); ``letters_purge``
  {journal, identity, upto}: remove them up to ``upto``.

The ops on an existing consumer (info, pull, settle, delete) may carry
``expect`` {owner, made}: the consumer the core believes it is (its owner
and creation nonce, :data:`~mc0.protocol.jetstream.MADE_KEY`).  The truth is
JetStream's: every op asks for the consumer's info first, and a pull asks
again after it brought records (it may have been made again meanwhile);
when the consumer of that name is another one (deleted and made again
elsewhere), the op does nothing (a pull gives back what it brought at once:
naked, never terminated) and answers ``{"changed": info}``, the consumer
that is there now.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import OrderedDict
from typing import Any

from ...protocol import jetstream as jsw
from .streams import API_TIMEOUT_S, StoreError, StreamSpec, ack_tokens, api

SETTLE_TIMEOUT_S = 1.0
# A settle (up to 10,000 seqs) asks JetStream with this many workers, each one ack at a time; and
# every settle of this broker together has at most MAX_REQUESTS acks in flight on the link thread
# (so one client's acks cannot pile tasks there that stall PubAcks and route traffic).
SETTLE_WORKERS = 64
MAX_REQUESTS = 256
MAX_LETTERS = 10_000  # letters read for one identity at once (beyond: at the next read)
DIRECT_BATCH = 1000
MAX_REPLIES = 100_000  # ack subjects remembered per consumer (the oldest forgotten first)
# Consumers (journal, name, made) whose ack subjects and settled seqs are remembered: one deleted
# or made again through another broker is never told here, so the oldest are forgotten beyond
# this (a forgotten one costs a CONSUMER.INFO at its next ack, and a repeat ack counted once more).
MAX_CONSUMER_KEYS = 1_024
Result = tuple[dict[str, Any], list[bytes]]


def consumer_info(info: dict[str, Any]) -> dict[str, Any]:
    """What the core reads of JetStream's consumer info."""
    config = info.get("config") or {}
    metadata = config.get("metadata") or {}
    return {
        "metadata": metadata,
        "made": str(metadata.get(jsw.MADE_KEY) or info.get("created") or ""),
        "delivered": int((info.get("delivered") or {}).get("stream_seq", 0)),
        "ack_floor": int((info.get("ack_floor") or {}).get("stream_seq", 0)),
        "num_ack_pending": int(info.get("num_ack_pending", 0)),
        "num_redelivered": int(info.get("num_redelivered", 0)),
        "num_waiting": int(info.get("num_waiting", 0)),
        "num_pending": int(info.get("num_pending", 0)),
    }


class StoreOps:
    def __init__(self, nc: Any, specs: dict[str, StreamSpec], *, max_requests: int = MAX_REQUESTS) -> None:
        self.nc = nc
        self.specs = specs
        self._requests = asyncio.Semaphore(max_requests)  # acks in flight, every settle together
        # (journal, consumer, made) -> seq -> the ack subject it was pulled with (made: that consumer's own)
        self._replies: dict[tuple[str, str, str], OrderedDict[int, str]] = {}
        # (journal, consumer, made) -> the seqs acked or terminated through this broker (no longer pending:
        # JetStream answers an ack of one alike, so a repeat is told apart here), the oldest forgotten first
        self._settled: dict[tuple[str, str, str], OrderedDict[int, None]] = {}

    # ------------------------------------------------------------ consumers
    async def _consumers(self, journal: str) -> list[dict[str, Any]]:
        """Every consumer of the journal's stream (their infos), page by page."""
        stream = jsw.stream_name(journal)
        found: list[dict[str, Any]] = []
        for _ in range(10_000):
            page = await api(self.nc, f"CONSUMER.LIST.{stream}", {"offset": len(found)})
            consumers = page.get("consumers") or []
            found += consumers
            if not consumers or len(found) >= int(page.get("total", 0)):
                break
        return found

    async def _info(self, request: dict[str, Any]) -> dict[str, Any]:
        stream = jsw.stream_name(request["journal"])
        return consumer_info(await api(self.nc, f"CONSUMER.INFO.{stream}.{request['name']}"))

    @staticmethod
    def _expected(request: dict[str, Any], info: dict[str, Any]) -> bool:
        """The consumer ``info`` describes is the one the request expects (or it expects none)."""
        expect = request.get("expect")
        if not isinstance(expect, dict):
            return True
        owner = str(info["metadata"].get(jsw.OWNER_KEY, ""))
        return owner == expect.get("owner") and info["made"] == expect.get("made")

    async def op_consumer_info(self, request: dict[str, Any]) -> Result:
        info = await self._info(request)
        return ({"info": info} if self._expected(request, info) else {"changed": info}), []

    async def op_consumer_lookup(self, request: dict[str, Any]) -> Result:
        try:
            return await self.op_consumer_info(request)
        except StoreError as exc:
            if exc.code != 404:
                raise
        owned = total = 0
        for journal, spec in self.specs.items():
            if spec.mailboxes:
                continue
            for consumer in await self._consumers(journal):
                metadata = (consumer.get("config") or {}).get("metadata") or {}
                if jsw.OWNER_KEY in metadata:
                    total += 1
                    owned += metadata[jsw.OWNER_KEY] == request["owner"]
        return {"owned": owned, "total": total}, []

    async def op_consumer_create(self, request: dict[str, Any]) -> Result:
        journal, name, config = request["journal"], request["name"], request["config"]
        stream = jsw.stream_name(journal)
        topics = [jsw.subject(journal, t) for t in config["topics"]]
        durable: dict[str, Any] = {
            "durable_name": name,
            "ack_policy": "explicit",
            "ack_wait": int(config["ack_wait_ms"]) * 1_000_000,
            "max_deliver": -1,  # mc0 dead-letters past max_deliver itself (see core.storeconsumers)
            "max_ack_pending": int(config["max_ack_pending"]),
            "deliver_policy": "new" if config["deliver"] == "new" else "all",
            "num_replicas": int(request.get("replicas", 0)),
            "metadata": {
                jsw.OWNER_KEY: request["owner"],
                jsw.CONFIG_KEY: json.dumps(config, sort_keys=True),
                jsw.MADE_KEY: secrets.token_hex(8),
            },
        }
        if len(topics) == 1:
            durable["filter_subject"] = topics[0]
        else:
            durable["filter_subjects"] = topics
        create = {"stream_name": stream, "config": durable, "action": "create"}
        return {"info": consumer_info(await api(self.nc, f"CONSUMER.CREATE.{stream}.{name}", create))}, []

    async def op_consumer_delete(self, request: dict[str, Any]) -> Result:
        journal, name = request["journal"], request["name"]
        if "expect" in request:
            info = await self._info(request)
            if not self._expected(request, info):
                return {"changed": info}, []
        await api(self.nc, f"CONSUMER.DELETE.{jsw.stream_name(journal)}.{name}")
        for memory in (self._replies, self._settled):
            for key in [k for k in memory if k[:2] == (journal, name)]:
                del memory[key]
        return {}, []

    async def op_consumer_list(self, request: dict[str, Any]) -> Result:
        mine = []
        for journal in request["journals"]:
            for consumer in await self._consumers(journal):
                metadata = (consumer.get("config") or {}).get("metadata") or {}
                if metadata.get(jsw.OWNER_KEY) == request["owner"]:
                    mine.append([journal, consumer.get("name", "")])
        return {"consumers": mine}, []

    async def op_consumer_list_all(self, request: dict[str, Any]) -> Result:
        """Every mc0 consumer of these journals, whoever owns it (an operator's listing)."""
        found = []
        for journal in request["journals"]:
            for consumer in await self._consumers(journal):
                info = consumer_info(consumer)
                if jsw.OWNER_KEY in info["metadata"]:
                    found.append([journal, consumer.get("name", ""), info])
        return {"consumers": found}, []

    async def op_consumer_report(self, request: dict[str, Any]) -> Result:
        """Every mc0 consumer of these journals with JetStream's figures (for /consumerz)."""
        rows = []
        for journal in request["journals"]:
            for consumer in await self._consumers(journal):
                info = consumer_info(consumer)
                if jsw.OWNER_KEY not in info["metadata"]:
                    continue  # not mc0's
                rows.append(
                    {
                        "journal": journal,
                        "name": consumer.get("name", ""),
                        "owner": info["metadata"][jsw.OWNER_KEY],
                        "store": "jetstream",
                        "num_pending": info["num_pending"],
                        "num_pending_exact": True,  # JetStream applies the topic filter
                        "num_ack_pending": info["num_ack_pending"],
                        "ack_floor": info["ack_floor"],
                        "redelivered": info["num_redelivered"],
                        "delivered": info["delivered"],
                        "waiting_pulls": info["num_waiting"],
                    }
                )
        return {"consumers": rows}, []

    async def op_consumer_pull(self, request: dict[str, Any]) -> Result:
        journal, name, batch = request["journal"], request["name"], int(request["batch"])
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{jsw.stream_name(journal)}.{name}"
        if "expect" in request:  # another's consumer is not pulled from (that would count a delivery)
            info = await self._info(request)
            if not self._expected(request, info):
                return {"changed": info}, []
        got = await self._next(subject, {"batch": batch, "no_wait": True}, API_TIMEOUT_S)
        wait = float(request.get("wait_ms", 0)) / 1000.0
        if not got and wait > 0:
            got = await self._next(subject, {"batch": 1, "expires": int(wait * 1e9)}, wait + API_TIMEOUT_S)
            if got and batch > 1:
                got += await self._next(subject, {"batch": batch - 1, "no_wait": True}, API_TIMEOUT_S)
        if got and "expect" in request:  # whose are they? (made again since the look above: a narrow race)
            info = await self._info(request)
            if not self._expected(request, info):
                for msg in got:  # another's: given back at once, for its owner (never terminated)
                    if msg.reply:
                        await self.nc.publish(msg.reply, b"-NAK")
                await self.nc.flush()
                return {"changed": info}, []
        key = (journal, name, self._made(request))
        replies = _remembered(self._replies, key)
        settled: dict[int, None] = self._settled.get(key, {})
        records, deliveries, payloads = [], [], []
        for msg in got:
            tokens = ack_tokens(msg.reply or "")
            if tokens is None:
                continue
            count, seq, _, ts = tokens
            replies[seq] = msg.reply
            settled.pop(seq, None)  # (delivered again: pending once more)
            records.append([seq, ts])
            deliveries.append(count)
            payloads.append(msg.data)
        while len(replies) > MAX_REPLIES:
            replies.popitem(last=False)
        return {"records": records, "deliveries": deliveries}, payloads

    @staticmethod
    def _made(request: dict[str, Any]) -> str:
        expect = request.get("expect")
        return str(expect.get("made", "")) if isinstance(expect, dict) else ""

    async def _next(self, subject: str, request: dict[str, Any], timeout: float) -> list[Any]:
        """One MSG.NEXT request: the messages it brings, until its status (404/408/409) or ``timeout``."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        got: list[Any] = []
        try:
            await self.nc.publish(subject, json.dumps(request).encode(), reply=inbox)
            deadline = time.monotonic() + timeout
            while len(got) < int(request["batch"]):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    msg = await sub.next_msg(timeout=left)
                except Exception:
                    break
                status = msg.headers.get("Status") if msg.headers else None
                if status is None:
                    got.append(msg)
                elif status == "503":
                    raise StoreError(503, "the consumer has no leader now (JetStream: no responders)")
                elif status != "100":
                    break  # 404 no messages, 408 expired, 409 ...: the request is over
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        return got

    async def op_consumer_settle(self, request: dict[str, Any]) -> Result:
        journal, name, how = request["journal"], request["name"], request["how"]
        stream = jsw.stream_name(journal)
        key = (journal, name, self._made(request))
        replies = self._replies.get(key, OrderedDict())
        settled = _remembered(self._settled, key)
        # One acked or terminated through this broker already is not pending: it counts nothing (nor is
        # JetStream asked).  One settled through another broker, above the ack floor, is not told apart.
        seqs = [s for s in (int(s) for s in request["seqs"]) if s not in settled]
        body = {"ack": b"+ACK", "term": b"+TERM", "nak": b"-NAK"}[how]
        delay = int(request.get("delay_ms", 0))
        if how == "nak" and delay:
            body = b"-NAK " + json.dumps({"delay": delay * 1_000_000}).encode()
        delivered = 0
        # Asked first when the consumer is to be checked, or a seq was pulled through another broker
        # (its ack subject is made here).
        if "expect" in request or any(s not in replies for s in seqs):
            info = await api(self.nc, f"CONSUMER.INFO.{stream}.{name}")
            if not self._expected(request, consumer_info(info)):
                return {"changed": consumer_info(info)}, []
            delivered = int((info.get("delivered") or {}).get("consumer_seq", 0))
            # A seq at or below the ack floor, or past the last one delivered, cannot be pending:
            # ignored without asking (each ask of one not pending waits SETTLE_TIMEOUT_S for nothing).
            floor = int((info.get("ack_floor") or {}).get("stream_seq", 0))
            last = int((info.get("delivered") or {}).get("stream_seq", 0))
            seqs = [s for s in seqs if s in replies or floor < s <= last]
        wanted = iter(seqs)

        final = how != "nak"

        async def worker() -> int:
            done = 0
            for seq in wanted:  # (shared: each seq is taken by one worker)
                if seq in settled:  # (settled meanwhile: the same seq twice, or a settle beside this one)
                    continue
                if final:
                    settled[seq] = None  # (claimed before the ask: a settle beside this one skips it)
                subject = replies.get(seq) or f"$JS.ACK.{stream}.{name}.1.{seq}.{delivered}.0.0"
                async with self._requests:
                    try:
                        await self.nc.request(subject, body, timeout=SETTLE_TIMEOUT_S)
                    except Exception:
                        if final:
                            settled.pop(seq, None)
                        continue
                if final:
                    replies.pop(seq, None)
                done += 1
            return done

        workers = min(SETTLE_WORKERS, len(seqs))
        done = sum(await asyncio.gather(*(worker() for _ in range(workers))))
        while len(settled) > MAX_REPLIES:
            settled.popitem(last=False)
        return {"done": done, "ignored": len(request["seqs"]) - done}, []

    # ------------------------------------------------------------ streams
    async def op_stream_purge(self, request: dict[str, Any]) -> Result:
        """Every record the journal's stream holds now goes (an operator's purge): ``{"purged",
        "first_seq"}``, the stream's first seq after it (what each broker's local copy drops up to)."""
        stream = jsw.stream_name(request["journal"])
        info = await api(self.nc, f"STREAM.INFO.{stream}")
        first_seq = int((info.get("state") or {}).get("last_seq", 0)) + 1
        purged = await api(self.nc, f"STREAM.PURGE.{stream}", {"seq": first_seq})
        return {"purged": int(purged.get("purged", 0)), "first_seq": first_seq}, []

    # ------------------------------------------------------------ mailboxes
    async def op_letters_read(self, request: dict[str, Any]) -> Result:
        journal = request["journal"]
        subject = jsw.letter_subject(journal, request["identity"])
        direct = f"$JS.API.DIRECT.GET.{jsw.stream_name(journal)}"
        records: list[list[int]] = []
        payloads: list[bytes] = []
        seq = int(request.get("after", 0)) + 1
        more = True
        while more and len(records) < MAX_LETTERS:
            more = False
            inbox = self.nc.new_inbox()
            sub = await self.nc.subscribe(inbox)
            try:
                get = {"seq": seq, "batch": DIRECT_BATCH, "next_by_subj": subject}
                await self.nc.publish(direct, json.dumps(get).encode(), reply=inbox)
                for _ in range(DIRECT_BATCH + 1):
                    msg = await sub.next_msg(timeout=API_TIMEOUT_S)
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status in ("204", "404", "408"):  # the batch ended; none (left)
                        break
                    if status is not None:
                        raise StoreError(503, f"JetStream direct get: {status} {headers.get('Description', '')}")
                    found = int(headers.get("Nats-Sequence", "0"))
                    records.append([found, 0])
                    payloads.append(msg.data)
                    seq = found + 1
                    more = int(headers.get("Nats-Num-Pending", "0") or 0) > 0
            except StoreError:
                raise
            except Exception as exc:
                raise StoreError(503, f"JetStream direct get did not answer ({type(exc).__name__})") from None
            finally:
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass
        return {"records": records}, payloads

    async def op_letters_purge(self, request: dict[str, Any]) -> Result:
        journal = request["journal"]
        subject = jsw.letter_subject(journal, request["identity"])
        purge = {"filter": subject, "seq": int(request["upto"]) + 1}
        await api(self.nc, f"STREAM.PURGE.{jsw.stream_name(journal)}", purge)
        return {}, []


def _remembered(
    memory: dict[tuple[str, str, str], OrderedDict[int, Any]], key: tuple[str, str, str]
) -> OrderedDict[int, Any]:
    """``memory[key]``, made if new; the oldest consumer's forgotten past ``MAX_CONSUMER_KEYS``."""
    kept = memory.get(key)
    if kept is None:
        while len(memory) >= MAX_CONSUMER_KEYS:
            del memory[next(iter(memory))]
        kept = memory[key] = OrderedDict()
    return kept
