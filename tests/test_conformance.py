"""The wire protocol as docs/PROTOCOL.md states it, against a real broker process, over raw ZeroMQ frames.

Contract: every statement the spec's client part (Transport to Batched framing, and the Worked examples)
makes about the wire is a case here, and each case names the section it checks (``@spec``), so a section
renamed, dropped or left without a case fails ``test_every_client_section_has_a_case``.  The numbers come
out of the document: the verb, header, status and limit tables are read from PROTOCOL.md and compared with
the protocol model (``mc0.protocol``) and, on the wire, with what the broker answers; the worked examples
are played line by line.  So the document and the broker cannot part ways without a failing test.

The brokers are real processes (``mc0 broker``): one without CURVE for the module, one with CURVE and real
keys for the Security cases, and short-lived ones for shutdown and restart.  Peers are pyzmq DEALER sockets
sending frames by hand, as a client written from the spec would.
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from mc0 import keys, ports
from mc0 import protocol as P
from mc0.broker.core.dispatch import CoreSettings
from mc0.process import BrokerProcess
from mc0.protocol import Header, Payload, Side, Status, Verb, batch
from mc0.settings import BrokerConfig

from .conftest import RawPeer

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "PROTOCOL.md"
TEXT = SPEC.read_text(encoding="utf-8")
# The sections a client needs (the spec's first part) and the worked examples: each needs a case.
CLIENT_PART = ("Transport", "Batched framing (protocol 1.0, optional)")
EXAMPLES = "Worked examples"


# ------------------------------------------------------------ reading the spec
def headings() -> list[tuple[int, str]]:
    """Every ``##``/``###`` heading of the spec, outside code blocks: (level, title)."""
    found: list[tuple[int, str]] = []
    fenced = False
    for line in TEXT.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^(##+) (.+)$", line)):
            found.append((len(match.group(1)), match.group(2).strip()))
    return found


def section(title: str) -> str:
    """The text of the section (with its subsections) under heading ``title``."""
    lines = TEXT.splitlines()
    fenced = False
    start = level = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^(##+) (.+)$", line)
        if match is None:
            continue
        if start is None and match.group(2).strip() == title:
            start, level = i + 1, len(match.group(1))
        elif start is not None and level is not None and len(match.group(1)) <= level:
            return "\n".join(lines[start:i])
    if start is None:
        raise AssertionError(f"docs/PROTOCOL.md has no section {title!r}")
    return "\n".join(lines[start:])


def _cells(row: str) -> list[str]:
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def tables(title: str) -> list[list[dict[str, str]]]:
    """The markdown tables of a section, each a list of rows keyed by the header row's cells."""
    found: list[list[dict[str, str]]] = []
    lines = section(title).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            names = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(names, _cells(lines[i]), strict=True)))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def code_blocks(title: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```$", section(title), flags=re.S | re.M)


def number(cell: str) -> int:
    """The first number of a table cell, thousands separators dropped (``8,388,608 bytes`` -> 8388608)."""
    match = re.search(r"\d[\d,]*", cell)
    assert match is not None, f"no number in {cell!r}"
    return int(match.group(0).replace(",", ""))


def limit(name: str) -> int:
    """A value of the Limits and defaults table, by its name cell (backticks dropped)."""
    for row in tables("Limits and defaults")[0]:
        if row["name"].strip("`") == name:
            return number(row["value"])
    raise AssertionError(f"Limits and defaults has no row {name!r}")


# ------------------------------------------------------------ naming what each case checks
F = TypeVar("F", bound=Callable[..., Any])
COVERED: dict[str, list[str]] = {}


def spec(*titles: str) -> Callable[[F], F]:
    """Mark a case as checking the sections ``titles`` of docs/PROTOCOL.md."""

    def mark(case: F) -> F:
        for title in titles:
            COVERED.setdefault(title, []).append(case.__name__)
        return case

    return mark


def client_sections() -> list[str]:
    """The titles of the spec's client part (Transport to Batched framing, with its subsections) and of
    the Worked examples with theirs."""
    found = headings()
    titles = [title for _, title in found]
    wanted: list[str] = []
    for first, last in (CLIENT_PART, (EXAMPLES, EXAMPLES)):
        i = titles.index(first)
        end = titles.index(last) + 1
        while end < len(found) and found[end][0] > 2:  # the last one's subsections
            end += 1
        wanted += titles[i:end]
    return wanted


# ------------------------------------------------------------ peers
def frames(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def parsed(message: list[bytes]) -> P.Command:
    """What the broker sent, read with the broker's grammar (it only sends what the spec allows)."""
    return P.decode(message, sender=Side.BROKER)


def error_of(message: list[bytes]) -> tuple[int, str, str | None]:
    command = parsed(message)
    assert command.verb is Verb.ERROR, message
    return int(command.headers["CODE"]), command.headers["MESSAGE"], command.id


class Peer(RawPeer):
    def __init__(
        self,
        endpoint: str,
        context: zmq.Context[Any],
        curve: tuple[bytes, bytes, bytes] | None = None,
        *,
        monitored: bool = False,
    ) -> None:
        """``curve``: (the broker's public key, ours, our secret), set before connecting.  With ``curve``
        or ``monitored``, ``monitor`` reports the handshake's events from the start: it is attached before
        the connect, since libzmq does not reconnect after a handshake's protocol error (the session ends),
        so an event missed then never comes again."""
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.monitor: zmq.Socket[bytes] | None = None
        if curve is not None:
            self.socket.curve_serverkey, self.socket.curve_publickey, self.socket.curve_secretkey = curve
        if curve is not None or monitored:
            self.monitor = self.socket.get_monitor_socket()
        self.socket.connect(endpoint)

    def events(
        self, seconds: float, until: Callable[[list[tuple[int, int]]], bool] | None = None
    ) -> list[tuple[int, int]]:
        """The monitor's (event, value) pairs over ``seconds``, or until ``until(seen)`` holds."""
        assert self.monitor is not None
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not (until and until(seen)):
            if self.monitor.poll(int(left * 1000) + 1):
                event = recv_monitor_message(self.monitor)
                seen.append((int(event["event"]), int(event["value"])))
        return seen

    def close(self) -> None:
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
        super().close()

    def recv_skipping_noop(self, timeout: float = 15.0) -> list[bytes]:  # (room for a loaded machine)
        return super().recv_skipping_noop(timeout)

    def ask(self, *parts: str | bytes, timeout: float = 15.0) -> list[bytes]:
        """Send a command and read the next message that is not a heartbeat."""
        self.send(*parts)
        return self.recv_skipping_noop(timeout)

    def hello(self, *extra: str, ttl: int = 5000) -> list[bytes]:
        return self.ask("CONNECT", "VERSION", "1.0", "TTL", str(ttl), *extra, "ID", "c")


@pytest.fixture(scope="module")
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def plain() -> Iterator[BrokerProcess]:
    """The module's broker: no CURVE (every identity ``anonymous``), every setting at its default."""
    with BrokerProcess(insecure=True, start_timeout=60) as process:
        yield process


@pytest.fixture
def peer(plain: BrokerProcess, context: zmq.Context[Any]) -> Iterator[Callable[..., Peer]]:
    """Factory of raw peers on the module's broker; ``connected`` ones have sent CONNECT VERSION 1.0."""
    made: list[Peer] = []

    def make(*, connected: bool = True, endpoint: str | None = None) -> Peer:
        one = Peer(endpoint or plain.endpoint, context)
        made.append(one)
        if connected:
            assert one.hello() == frames("OK", "ID", "c", "TTL", "5000")
        return one

    yield make
    for one in made:
        one.close()


# ------------------------------------------------------------ the tables against the model
def header_cell(cell: str) -> tuple[set[str], set[str], bool]:
    """A verb table's headers cell -> (required, optional, takes user headers: ``X-...``, or the trace
    context alone, which the model counts with them). ``[KEY v]`` is optional."""
    required: set[str] = set()
    optional: set[str] = set()
    depth = 0
    for token in re.findall(r"\[|\]|X-\.\.\.|[A-Z][A-Z0-9_-]+|\S", cell.replace("`", "")):
        if token == "[":
            depth += 1
        elif token == "]":
            depth -= 1
        elif token in Header.__members__:
            (optional if depth else required).add(token)
    return required, optional, "X-..." in cell or "traceparent" in cell


def positional_kind(cell: str) -> Payload:
    if cell.startswith("none"):
        return Payload.NONE
    return Payload.OPTIONAL if "zero or more" in cell else Payload.REQUIRED


@spec("Verbs")
@pytest.mark.parametrize(("index", "grammar"), [(0, P.PEER_GRAMMAR), (1, P.BROKER_GRAMMAR)], ids=["peer", "broker"])
def test_the_verb_tables_are_the_grammar_every_verb_every_header(index: int, grammar: dict[Verb, P.Grammar]) -> None:
    rows = tables("Verbs")[index]
    listed = {row["verb"].strip("`"): row for row in rows}
    assert set(listed) == {verb.value for verb in grammar}
    for verb, rule in grammar.items():
        row = listed[verb.value]
        required, optional, user = header_cell(row["headers"])
        assert required == {h.value for h in rule.required}, verb
        assert optional == {h.value for h in rule.optional}, verb
        assert user is rule.user_headers, verb
        assert positional_kind(row["positional"]) is rule.payload, verb
        if grammar is P.PEER_GRAMMAR:
            assert (row["since"] == "0.1") is rule.seed, verb


@spec("Headers")
def test_the_header_table_lists_every_reserved_header_and_the_verbs_of_each_side() -> None:
    rows = {row["header"].strip("`"): row for row in tables("Headers")[0]}
    assert set(rows) == set(Header.__members__)
    for header in Header:
        for column, grammar in (("peer sends it in", P.PEER_GRAMMAR), ("broker sends it in", P.BROKER_GRAMMAR)):
            named = set(rows[header.value][column].replace("–", "").split())
            takes = {v.value for v, g in grammar.items() if header in g.required or header in g.optional}
            assert named == takes, (header, column)


@spec("Status codes")
def test_the_status_table_lists_every_code_and_the_worker_codes_are_the_models() -> None:
    listed = {number(row["code"]) for row in tables("Status codes")[0]}
    assert listed == {int(code) for code in Status}
    text = " ".join(section("Status codes").split())
    match = re.search(r"one an application may mean: ([\d ]+)", text)
    assert match is not None
    assert {int(code) for code in match.group(1).split()} == P.WORKER_CODES


@spec("Limits and defaults")
def test_the_limits_table_is_the_brokers_defaults() -> None:
    limits, settings, broker = P.Limits(), CoreSettings(), BrokerConfig()
    for name in ("max_frames", "max_message_bytes", "max_frame_bytes", "max_headers", "max_topic_bytes"):
        assert limit(name) == getattr(limits, name), name
    for name in ("max_topic_tokens", "max_subscriptions", "max_batch_bytes"):
        assert limit(name) == getattr(limits, name), name
    for name in ("min_ttl_ms", "max_ttl_ms", "liveness", "request_timeout_ms", "max_request_timeout_ms"):
        assert limit(name) == getattr(settings, name), name
    for name in ("max_capacity", "max_requests", "max_queue", "max_attempts", "slow_consumer_ms"):
        assert limit(name) == getattr(settings, name), name
    for name in ("mailbox_max_messages", "mailbox_max_bytes", "mailbox_ttl_ms", "mailboxes_max_bytes"):
        assert limit(name) == getattr(settings, name), name
    for name in ("max_queue_bytes", "max_queue_messages"):
        assert limit(name) == getattr(broker, name), name
    assert limit("default TTL") == P.DEFAULT_TTL_MS
    assert limit("heartbeat") == P.HEARTBEAT_FRACTION * 100
    assert limit("default CAPACITY") == 1
    assert limit("service name") == P.MAX_SERVICE_BYTES
    assert limit("group name") == P.MAX_GROUP_BYTES
    assert limit("number") == P.MAX_DECIMAL_DIGITS
    assert limit("JSON body") == P.MAX_JSON_BYTES and f"depth {P.MAX_JSON_DEPTH}" in section("Limits and defaults")


@spec("Key files")
def test_the_key_file_example_is_the_format_mc0_and_zeromq_read(tmp_path: Path) -> None:
    (example,) = [block for block in code_blocks("Key files") if "secret-key" in block]
    path = tmp_path / "alice.key_secret"
    path.write_text(example)
    path.chmod(0o600)
    pair = keys.load_secret(path)
    public, secret = zmq.auth.load_certificate(str(path))
    assert (pair.public, pair.secret) == (public, secret) and len(public) == len(secret or b"") == 40
    assert zmq.curve_public(secret or b"") == public  # the example is a real keypair
    public_file, secret_file = keys.create(tmp_path / "made", "bob")  # what mc0 writes has the spec's shape
    text = secret_file.read_text()
    assert re.search(r'^curve\n    public-key = "[^"]{40}"\n    secret-key = "[^"]{40}"$', text, flags=re.M), text
    assert "secret-key" not in public_file.read_text()
    assert secret_file.stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------ message format
@spec("Message format")
def test_the_empty_delimiter_is_needed_only_before_positional_frames(peer: Callable[..., Peer]) -> None:
    one = peer()
    assert one.ask("NOOP", "ID", "1") == frames("OK", "ID", "1")
    assert one.ask("NOOP", "ID", "2", "") == frames("OK", "ID", "2")  # the same message
    assert error_of(one.ask("PUT", "TOPIC", "t", "ID", "3", ""))[:2] == (
        400,
        "PUT needs positional frames after an empty frame",
    )
    assert one.ask("PUT", "TOPIC", "t", "ID", "4", "", "") == frames("OK", "ID", "4")  # one empty body frame
    assert error_of(one.ask("NOOP", "ID", "5", "", "extra"))[:2] == (400, "NOOP takes no positional frames")


@spec("Message format")
def test_header_order_means_nothing(peer: Callable[..., Peer]) -> None:
    one = peer(connected=False)
    assert one.ask("CONNECT", "ID", "c", "TTL", "300", "VERSION", "1.0") == frames("OK", "ID", "c", "TTL", "300")
    sub = peer()
    sub.ask("SUB", "ID", "s", "", "order.*")
    assert one.ask("PUT", "ID", "p", "X-B", "2", "TOPIC", "order.x", "X-A", "1", "", "x") == frames("OK", "ID", "p")
    got = parsed(sub.recv_skipping_noop())
    assert got.headers == {"TOPIC": "order.x", "SENDER": "anonymous", "X-B": "2", "X-A": "1"}


@spec("Message format")
@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("id", "unknown header id"),
        ("Id", "unknown header Id"),
        ("x-trace", "unknown header x-trace"),
        ("X-", "unknown header X-"),
        ("FOO", "unknown header FOO"),
        (b"X-\xff", "unknown header X-\\xff"),
        ("SENDER", "PUT does not take header SENDER"),
    ],
)
def test_keys_are_byte_exact_and_case_sensitive(peer: Callable[..., Peer], key: str | bytes, reason: str) -> None:
    assert error_of(peer().ask("PUT", "TOPIC", "t", key, "v", "ID", "k", "", "x")) == (400, reason, "k")


@spec("Message format", "Error texts")
def test_verbs_are_byte_exact_and_error_texts_show_wire_bytes(peer: Callable[..., Peer]) -> None:
    one = peer()
    assert error_of(one.ask("connect", "ID", "v")) == (400, "unknown verb connect", "v")
    assert error_of(one.ask(b"\x00ab", "ID", "w")) == (400, "unknown verb \\x00ab", "w")
    assert error_of(one.ask("NOOP", "ID", "r", "ID", "s")) == (400, "header ID repeated", "r")
    assert error_of(one.ask("NOOP", "ID", "t", "X-A")) == (400, "header X-A has no value", "t")
    assert error_of(one.ask("PUT", "TOPIC", b"\xff", "", "x")) == (400, "header TOPIC is not UTF-8", None)
    assert one.ask("NOOP", "ID", "") == frames("OK", "ID", "")  # an empty value is legal


@spec("Message format")
@pytest.mark.parametrize(
    ("ttl", "answer"),
    [
        ("0012", 100),  # 12, raised to min_ttl_ms
        ("1" * 18, 60_000),
        ("1" * 19, "TTL must be a decimal integer, got '1111111111111111111'"),
        ("-5", "TTL must be a decimal integer, got '-5'"),
        ("1e3", "TTL must be a decimal integer, got '1e3'"),
        (" 5", "TTL must be a decimal integer, got ' 5'"),
        ("", "TTL must be a decimal integer, got ''"),
        ("٥", "TTL must be a decimal integer, got '٥'"),  # a digit, but not an ASCII one
    ],
)
def test_numbers_are_1_to_18_ascii_digits(peer: Callable[..., Peer], ttl: str, answer: int | str) -> None:
    assert limit("number") == 18
    got = peer(connected=False).ask("CONNECT", "VERSION", "1.0", "TTL", ttl, "ID", "n")
    if isinstance(answer, int):
        assert got == frames("OK", "ID", "n", "TTL", str(answer))
    else:
        assert error_of(got) == (400, answer, "n")


# ------------------------------------------------------------ IDs and answers
@spec("IDs and answers")
def test_an_id_is_any_utf8_echoed_byte_for_byte_and_may_repeat(peer: Callable[..., Peer]) -> None:
    one = peer()
    for rid in ("é ☃ x", "", "7" * 70_000):
        assert one.ask("NOOP", "ID", rid) == frames("OK", "ID", rid)
    assert one.ask("PING", "ID", "p") == frames("PONG", "ID", "p")
    assert one.ask("NOOP", "ID", "same") == one.ask("NOOP", "ID", "same") == frames("OK", "ID", "same")


@spec("IDs and answers")
def test_without_id_nothing_comes_back_unless_something_went_wrong(peer: Callable[..., Peer]) -> None:
    one = peer()
    one.send("NOOP")
    one.send("SUB", "", "quiet.x")
    one.send("PUT", "TOPIC", "loud.x", "", "z")
    one.send("UNSUB", "", "quiet.x")
    one.send("CANCEL", "ID", "never-sent")  # a CANCEL of nothing gets nothing
    one.send("FINAL", "ID", "99999", "", "x")  # a worker's reply for an id it was not given: dropped
    assert one.nothing(0.5)
    assert error_of(one.ask("PUT", "TOPIC", "a.*", "", "x")) == (
        400,
        "invalid topic 'a.*': wildcards are not allowed in a published topic",
        None,
    )


@spec("IDs and answers")
def test_only_a_requests_id_must_be_unique_among_its_outstanding_requests(peer: Callable[..., Peer]) -> None:
    client, worker = peer(), peer()
    assert worker.ask("READY", "ID", "w", "", "conf.idle") == frames("OK", "ID", "w")
    client.send("REQUEST", "SERVICE", "conf.idle", "ID", "r", "TIMEOUT", "20000")
    bid = parsed(worker.recv_skipping_noop()).id
    assert error_of(client.ask("REQUEST", "SERVICE", "conf.idle", "ID", "r")) == (
        409,
        "request id 'r' is already outstanding",
        "r",
    )
    worker.send("FINAL", "ID", str(bid), "", "done")
    assert client.recv_skipping_noop() == frames("FINAL", "ID", "r", "", "done")


# ------------------------------------------------------------ verbs and headers
# A well-formed instance of each 1.0 verb a peer sends (BATCH: one PUT record).
VALID_1_0 = {
    Verb.PING: ("ID", "x"),
    Verb.READY: ("ID", "x", "", "svc"),
    Verb.REQUEST: ("SERVICE", "svc", "ID", "x"),
    Verb.CANCEL: ("ID", "x"),
    Verb.PARTIAL: ("ID", "x"),
    Verb.FINAL: ("ID", "x"),
    Verb.ERROR: ("ID", "x", "CODE", "500", "MESSAGE", "m"),
    Verb.BATCH: ("", batch.put_record(b"t", b"x")),
}


@spec("Verbs")
@pytest.mark.parametrize("verb", [v for v, g in P.PEER_GRAMMAR.items() if not g.seed])
def test_a_0x_peer_gets_400_for_every_1_0_verb(peer: Callable[..., Peer], verb: Verb) -> None:
    old = peer(connected=False)
    assert parsed(old.ask("CONNECT", "VERSION", "0.3", "ID", "c")).verb is Verb.OK
    code, reason, _ = error_of(old.ask(verb.value, *VALID_1_0[verb]))
    wanted = (
        "BATCH needs CONNECT ... BATCH 1 first" if verb is Verb.BATCH else f"{verb.value} is not part of protocol 0.3"
    )
    assert (code, reason) == (400, wanted)


@spec("Verbs", "Headers")
@pytest.mark.parametrize("verb", list(P.PEER_GRAMMAR))
def test_each_peer_verb_takes_only_its_headers(peer: Callable[..., Peer], verb: Verb) -> None:
    """SENDER is the broker's (in no peer verb): each verb refuses it, naming it."""
    code, reason, _ = error_of(peer().ask(verb.value, "SENDER", "me", "ID", "x", "", "x"))
    assert (code, reason) == (400, f"{verb.value} does not take header SENDER")


@spec("Verbs")
@pytest.mark.parametrize("verb", [v for v in P.BROKER_GRAMMAR if v not in P.PEER_GRAMMAR])
def test_a_verb_only_the_broker_sends_is_400_from_a_peer(peer: Callable[..., Peer], verb: Verb) -> None:
    assert error_of(peer().ask(verb.value, "ID", "x")) == (400, f"{verb.value} is not sent by a peer", "x")


@spec("Headers", "Versions")
def test_sender_is_stamped_for_1_0_and_absent_for_0x_and_x_headers_pass(peer: Callable[..., Peer]) -> None:
    new, old, pub = peer(), peer(connected=False), peer()
    old.ask("CONNECT", "VERSION", "0.1", "ID", "c")
    new.ask("SUB", "ID", "s", "", "stamp.x")
    old.ask("SUB", "ID", "s", "", "stamp.x")
    pub.ask("PUT", "TOPIC", "stamp.x", "X-REPLY-TO", "me", "ID", "p", "", "b1", "b2")
    assert new.recv_skipping_noop() == frames(
        "MESSAGE", "TOPIC", "stamp.x", "SENDER", "anonymous", "X-REPLY-TO", "me", "", "b1", "b2"
    )
    assert old.recv_skipping_noop() == frames("MESSAGE", "TOPIC", "stamp.x", "X-REPLY-TO", "me", "", "b1", "b2")


@spec("Verbs")
def test_echo_0_never_hands_a_peer_its_own_publication(peer: Callable[..., Peer]) -> None:
    quiet, loud = peer(connected=False), peer()
    assert quiet.ask("CONNECT", "VERSION", "1.0", "ECHO", "0", "ID", "c") == frames("OK", "ID", "c", "TTL", "5000")
    for one in (quiet, loud):
        one.ask("SUB", "ID", "s", "", "echo.x")
    quiet.ask("PUT", "TOPIC", "echo.x", "ID", "p", "", "mine")
    assert payload(loud.recv_skipping_noop()) == [b"mine"]
    assert quiet.nothing(0.3)


def payload(message: list[bytes]) -> list[bytes]:
    return list(parsed(message).payload)


# ------------------------------------------------------------ sessions
@spec("Connecting")
def test_before_connect_everything_is_401_and_disconnect_is_acknowledged(peer: Callable[..., Peer]) -> None:
    stranger = peer(connected=False)
    not_connected = "not connected: send CONNECT first"
    assert error_of(stranger.ask("NOOP", "ID", "n")) == (401, not_connected, "n")
    assert error_of(stranger.ask("SUB", "", "x")) == (401, not_connected, None)
    assert stranger.ask("DISCONNECT", "ID", "d") == frames("OK", "ID", "d")
    stranger.send("DISCONNECT")
    assert stranger.nothing(0.3)


@spec("Connecting", "Versions")
def test_without_version_a_peer_speaks_0_1_and_other_versions_are_505(peer: Callable[..., Peer]) -> None:
    assert limit("default TTL") == 5000
    old = peer(connected=False)
    assert old.ask("CONNECT", "ID", "c") == frames("OK", "ID", "c", "TTL", "5000")
    assert error_of(old.ask("PING", "ID", "p"))[:2] == (400, "PING is not part of protocol 0.1")
    assert error_of(peer(connected=False).ask("CONNECT", "VERSION", "2.0", "ID", "v")) == (
        505,
        "version '2.0' unsupported; this broker speaks 0.1, 0.2, 0.3, 1.0",
        "v",
    )


@spec("Connecting", "Limits and defaults")
def test_ttl_is_clamped_to_the_tables_bounds_and_zero_is_400(peer: Callable[..., Peer]) -> None:
    low, high = limit("min_ttl_ms"), limit("max_ttl_ms")
    one = peer(connected=False)
    assert one.ask("CONNECT", "VERSION", "1.0", "TTL", "1", "ID", "a") == frames("OK", "ID", "a", "TTL", str(low))
    wanted = frames("OK", "ID", "b", "TTL", str(high))
    assert one.ask("CONNECT", "VERSION", "1.0", "TTL", str(high * 10), "ID", "b") == wanted
    assert one.ask("CONNECT", "VERSION", "1.0", "TTL", "1234", "ID", "c") == frames("OK", "ID", "c", "TTL", "1234")
    assert error_of(one.ask("CONNECT", "VERSION", "1.0", "TTL", "0", "ID", "d")) == (
        400,
        "TTL must be at least 1, got 0",
        "d",
    )


@spec("Connecting", "IDs and answers")
def test_a_connect_without_id_is_not_answered_but_opens_the_session(peer: Callable[..., Peer]) -> None:
    quiet = peer(connected=False)
    quiet.send("CONNECT", "VERSION", "1.0", "TTL", "300")
    assert quiet.nothing(0.5)  # not even an OK: only heartbeats
    assert quiet.ask("NOOP", "ID", "n") == frames("OK", "ID", "n")  # a session, not a 401
    assert quiet.ask("PING", "ID", "p") == frames("PONG", "ID", "p")  # a 1.0 one
    refused = peer(connected=False)
    assert error_of(refused.ask("CONNECT", "VERSION", "9.9")) == (
        505,
        "version '9.9' unsupported; this broker speaks 0.1, 0.2, 0.3, 1.0",
        None,
    )


@spec("Connecting")
def test_batch_and_echo_need_1_0_and_are_0_or_1(peer: Callable[..., Peer]) -> None:
    for version, header, value in (("0.3", "BATCH", "1"), ("0.3", "ECHO", "0"), ("1.0", "ECHO", "2")):
        got = peer(connected=False).ask("CONNECT", "VERSION", version, header, value, "ID", "c")
        assert error_of(got) == (400, f"{header} must be 0 or 1, and needs protocol 1.0", "c")


@spec("Connecting")
def test_a_new_connect_starts_a_fresh_session_only_once_it_is_valid(peer: Callable[..., Peer]) -> None:
    sub, pub = peer(), peer()
    sub.ask("SUB", "ID", "s", "", "fresh.x")
    assert error_of(sub.ask("CONNECT", "VERSION", "7.0", "ID", "bad"))[0] == 505  # changes nothing
    pub.ask("PUT", "TOPIC", "fresh.x", "ID", "p", "", "1")
    assert payload(sub.recv_skipping_noop()) == [b"1"]
    assert sub.hello() == frames("OK", "ID", "c", "TTL", "5000")  # a fresh session: the SUB is gone
    pub.ask("PUT", "TOPIC", "fresh.x", "ID", "p", "", "2")
    assert sub.nothing(0.3)


@spec("Heartbeats and liveness", "Limits and defaults")
def test_the_broker_sends_noop_at_half_the_ttl(peer: Callable[..., Peer]) -> None:
    """At TTL 400 the broker beats every 200 ms: over 2 s an idle peer hears at least 4 NOOPs (10 due; room
    for a loaded machine), and nothing else."""
    assert limit("heartbeat") == 50
    one = peer(connected=False)
    assert one.hello(ttl=400) == frames("OK", "ID", "c", "TTL", "400")
    beats = 0
    deadline = time.monotonic() + 2.0
    while (left := deadline - time.monotonic()) > 0:
        if one.socket.poll(int(left * 1000) + 1):
            assert one.socket.recv_multipart() == [b"NOOP"]
            beats += 1
    assert beats >= 4


def watch_peers(peer: Callable[..., Peer]) -> Peer:
    watcher = peer()
    assert watcher.ask("SUB", "ID", "w", "", P.SYS_PEER_TOPIC) == frames("OK", "ID", "w")
    return watcher


def next_event(watcher: Peer, event: str, timeout: float = 15.0, **fields: str) -> dict[str, Any]:
    """The next ``mc0.sys.peer`` record of ``event`` whose fields are ``fields`` (others are skipped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        record = json.loads(payload(watcher.recv_skipping_noop(left))[0])
        if record["event"] == event and all(record.get(k) == v for k, v in fields.items()):
            return dict(record)
    raise AssertionError(f"no {event} event with {fields} within {timeout}s")


@spec("Heartbeats and liveness", "How a session ends")
def test_a_peer_silent_for_liveness_times_ttl_is_forgotten_and_then_gets_401(peer: Callable[..., Peer]) -> None:
    assert limit("liveness") == 3
    watcher = watch_peers(peer)
    silent = peer(connected=False)
    started = time.monotonic()
    assert silent.hello(ttl=100) == frames("OK", "ID", "c", "TTL", "100")
    name = next_event(watcher, "connect", protocol="1.0")["peer"]
    next_event(watcher, "disconnect", peer=name, reason="expired")
    assert time.monotonic() - started >= 0.3  # 3 x 100 ms after its last message, at least
    assert error_of(silent.ask("NOOP", "ID", "late"))[:2] == (401, "not connected: send CONNECT first")


@spec("Sessions", "How a session ends")
def test_disconnect_ends_the_session_and_a_closed_connection_too(peer: Callable[..., Peer]) -> None:
    watcher = watch_peers(peer)
    leaving = peer()
    name = next_event(watcher, "connect", protocol="1.0")["peer"]
    assert leaving.ask("DISCONNECT", "ID", "bye") == frames("OK", "ID", "bye")
    next_event(watcher, "disconnect", peer=name, reason="disconnected")
    assert error_of(leaving.ask("NOOP", "ID", "n"))[0] == 401
    closing = peer()
    name = next_event(watcher, "connect", protocol="1.0")["peer"]
    closing.close()
    next_event(watcher, "disconnect", peer=name, reason="closed")


@spec("How a session ends", "The start-up, exactly as the broker does it")
def test_a_broker_shutting_down_sends_disconnect_as_a_plain_message(context: zmq.Context[Any]) -> None:
    with BrokerProcess(insecure=True, start_timeout=60) as broker:
        plain, batched = Peer(broker.endpoint, context), Peer(broker.endpoint, context)
        assert plain.hello() == frames("OK", "ID", "c", "TTL", "5000")
        assert batched.hello("BATCH", "1") == frames("OK", "ID", "c", "TTL", "5000", "BATCH", "1")
        assert broker.stop() == 0
        assert plain.recv_skipping_noop() == frames("DISCONNECT")
        assert batched.recv_skipping_noop() == frames("DISCONNECT")
        plain.close()
        batched.close()


@spec("Healing after a broker restart")
def test_subs_may_follow_connect_at_once_and_a_refused_connect_makes_them_401(peer: Callable[..., Peer]) -> None:
    eager, pub = peer(connected=False), peer()
    eager.send("CONNECT", "VERSION", "1.0", "ID", "c")
    eager.send("SUB", "ID", "s", "", "eager.x")
    pub.ask("PUT", "TOPIC", "eager.x", "ID", "p", "", "hi")
    assert eager.recv_skipping_noop() == frames("OK", "ID", "c", "TTL", "5000")
    assert eager.recv_skipping_noop() == frames("OK", "ID", "s")
    refused = peer(connected=False)
    refused.send("CONNECT", "VERSION", "2.0", "ID", "c")
    refused.send("SUB", "ID", "s", "", "eager.x")
    assert error_of(refused.recv_skipping_noop())[0] == 505
    assert error_of(refused.recv_skipping_noop()) == (401, "not connected: send CONNECT first", "s")


@spec("Healing after a broker restart", "Failing over to another broker", "How a session ends")
def test_after_a_restart_the_old_session_is_401_connect_then_sub_heals_and_a_resent_put_is_stored_once(
    context: zmq.Context[Any], tmp_path: Path
) -> None:
    """The new broker (another process on the same endpoint, the same journal folder) is what a failover
    reaches too: CONNECT, SUB again, and a confirmed PUT sent again with its MSGID is a DUPLICATE."""
    endpoint = f"tcp://127.0.0.1:{ports.free_port()}"
    config = tmp_path / "journal.toml"
    config.write_text('[journals.main]\ntopics = ["heal.>"]\n')
    options: dict[str, Any] = {"insecure": True, "bind": (endpoint,), "start_timeout": 60, "config": str(config)}
    first = BrokerProcess(**options).start()
    one = Peer(endpoint, context)
    stored = frames("OK", "ID", "p", "JOURNAL", "main", "SEQ", "1")
    try:
        assert one.hello() == frames("OK", "ID", "c", "TTL", "5000")
        assert one.ask("SUB", "ID", "s", "", "heal.x") == frames("OK", "ID", "s")
        one.send("PUT", "TOPIC", "heal.x", "ID", "p", "MSGID", "m1", "", "once")
        # (the OK waits for the journal's write: the MESSAGE may come first; IDs and answers)
        got = sorted((one.recv_skipping_noop() for _ in range(2)), key=lambda m: m[0])
        assert got == [
            frames("MESSAGE", "TOPIC", "heal.x", "SENDER", "anonymous", "JOURNAL", "main", "SEQ", "1", "", "once"),
            stored,
        ]
        first.kill()  # no DISCONNECT: killed
        with BrokerProcess(**options) as second:
            assert second.endpoint == endpoint
            assert error_of(one.ask("NOOP", "ID", "n", timeout=30)) == (401, "not connected: send CONNECT first", "n")
            assert one.hello() == frames("OK", "ID", "c", "TTL", "5000")
            assert one.ask("SUB", "ID", "s", "", "heal.x") == frames("OK", "ID", "s")
            assert one.ask("PUT", "TOPIC", "heal.x", "ID", "p", "MSGID", "m1", "", "once") == [
                *stored,
                b"DUPLICATE",
                b"1",
            ]
            one.send("PUT", "TOPIC", "heal.x", "", "back")
            assert payload(one.recv_skipping_noop()) == [b"back"]
    finally:
        first.kill()
        one.close()


@spec("Enveloped peers")
def test_an_enveloped_session_gets_the_empty_frame_on_everything_and_no_batches(peer: Callable[..., Peer]) -> None:
    old = peer(connected=False)
    assert old.ask("", "CONNECT", "VERSION", "1.0", "BATCH", "1", "ID", "c") == frames(
        "", "OK", "ID", "c", "TTL", "5000"
    )
    assert old.ask("", "NOOP", "ID", "n") == frames("", "OK", "ID", "n")
    got = old.ask("NOOP", "ID", "bare")
    assert got[0] == b"" and error_of(got[1:]) == (
        400,
        "this session was opened behind an empty frame: keep its framing",
        "bare",
    )


# ------------------------------------------------------------ topics
@spec("Topics and patterns")
def test_topics_patterns_and_the_brokers_own(peer: Callable[..., Peer]) -> None:
    sub, pub = peer(), peer()
    assert sub.ask("SUB", "ID", "s", "", "top.>", "top.*", "*.a") == frames("OK", "ID", "s")
    assert sub.ask("SUB", "ID", "again", "", "top.*") == frames("OK", "ID", "again")  # the same subscription
    assert sub.ask("SUB", "ID", "all", "", ">") == frames("OK", "ID", "all")
    pub.ask("PUT", "TOPIC", "top.a", "ID", "p", "", "once")
    assert payload(sub.recv_skipping_noop()) == [b"once"]
    assert sub.nothing(0.3)  # four patterns match: one MESSAGE
    assert error_of(pub.ask("PUT", "TOPIC", "mc0.sys.x", "ID", "p", "", "x")) == (
        403,
        "topics mc0.sys.> are the broker's own",
        "p",
    )
    for bad, reason in (("a..b", "empty token"), ("a b", "whitespace")):
        code, text, _ = error_of(pub.ask("PUT", "TOPIC", bad, "ID", "p", "", "x"))
        assert code == 400 and reason in text
    # SUB is all or nothing: one bad pattern, nothing subscribed
    picky = peer()
    assert error_of(picky.ask("SUB", "ID", "t", "", "none.x", "a..b"))[0] == 400
    pub.ask("PUT", "TOPIC", "none.x", "ID", "p", "", "x")
    assert picky.nothing(0.3)
    assert picky.ask("UNSUB", "ID", "u", "", "never.subscribed") == frames("OK", "ID", "u")
    watcher = peer()  # `>` never reaches the broker's own topics
    assert watcher.ask("SUB", "ID", "w", "", ">") == frames("OK", "ID", "w")
    peer().close()
    assert watcher.nothing(0.5)


# ------------------------------------------------------------ limits
@spec("Limits and defaults", "Message format")
def test_the_per_message_limits_answer_413_at_one_past_the_tables_values(peer: Callable[..., Peer]) -> None:
    one = peer()
    most = limit("max_frames")
    head = ["PUT", "TOPIC", "t", "ID", "f", ""]
    assert one.ask(*head, *["b"] * (most - len(head))) == frames("OK", "ID", "f")
    assert error_of(one.ask(*head, *["b"] * (most - len(head) + 1))) == (
        413,
        f"{most + 1} frames, the limit is {most}",
        "f",
    )
    most = limit("max_message_bytes")
    fixed = sum(map(len, frames(*head)))
    assert one.ask(*head, b"x" * (most - fixed)) == frames("OK", "ID", "f")
    assert error_of(one.ask(*head, b"x" * (most - fixed + 1))) == (413, f"{most + 1} bytes, the limit is {most}", "f")
    most = limit("max_headers")
    users = [part for i in range(most - 2) for part in (f"X-{i}", "v")]
    assert one.ask("PUT", "TOPIC", "t", "ID", "h", *users, "", "x") == frames("OK", "ID", "h")
    assert error_of(one.ask("PUT", "TOPIC", "t", "ID", "h", *users, "X-more", "v", "", "x"))[:2] == (
        413,
        f"more than {most} headers",
    )


@spec("Limits and defaults", "Topics and patterns")
def test_topic_bytes_and_tokens_answer_413_beyond_the_tables_values(peer: Callable[..., Peer]) -> None:
    one = peer()
    most_bytes, most_tokens = limit("max_topic_bytes"), limit("max_topic_tokens")
    for topic, code in (
        ("a" * most_bytes, None),
        ("a" * (most_bytes + 1), 413),
        (".".join(["a"] * most_tokens), None),
        (".".join(["a"] * (most_tokens + 1)), 413),
    ):
        got = one.ask("PUT", "TOPIC", topic, "ID", "t", "", "x")
        assert (got == frames("OK", "ID", "t")) if code is None else error_of(got)[0] == code


@spec("Limits and defaults")
def test_subscriptions_beyond_the_tables_limit_are_429(peer: Callable[..., Peer]) -> None:
    one = peer()
    most = limit("max_subscriptions")
    chunk = 1000
    for start in range(0, most, chunk):
        patterns = [f"many.{i}" for i in range(start, min(most, start + chunk))]
        assert one.ask("SUB", "ID", "s", "", *patterns) == frames("OK", "ID", "s")
    assert error_of(one.ask("SUB", "ID", "s", "", "one.more"))[0] == 429


@spec("Transport", "Limits and defaults")
def test_a_frame_over_max_frame_bytes_drops_the_connection_and_nothing_is_processed(
    peer: Callable[..., Peer],
) -> None:
    one = peer()
    monitor = one.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        one.send("PUT", "TOPIC", "t", "ID", "big", "", b"x" * (limit("max_frame_bytes") + 1))
        assert monitor.poll(20_000), "the connection was not dropped"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        one.socket.disable_monitor()
        monitor.close(linger=0)


# ------------------------------------------------------------ service requests and status codes
def serve(peer: Callable[..., Peer], service: str, *extra: str) -> Peer:
    worker = peer()
    assert worker.ask("READY", "ID", "r", *extra, "", service) == frames("OK", "ID", "r")
    return worker


def work(worker: Peer) -> P.Command:
    command = parsed(worker.recv_skipping_noop())
    assert command.verb is Verb.REQUEST, command
    return command


@spec("Status codes", "Limits and defaults")
def test_a_request_without_timeout_gets_the_default_and_a_larger_one_is_lowered(peer: Callable[..., Peer]) -> None:
    worker, client = serve(peer, "conf.time"), peer()
    for asked, most in ((None, limit("request_timeout_ms")), ("1000000000", limit("max_request_timeout_ms"))):
        timeout = ("TIMEOUT", asked) if asked else ()
        client.send("REQUEST", "SERVICE", "conf.time", "ID", "t", *timeout)
        got = work(worker)
        assert most - 10_000 < int(got.headers["TIMEOUT"]) <= most
        assert got.headers["CALLER"] == "anonymous"
        worker.send("FINAL", "ID", str(got.id))
        assert client.recv_skipping_noop() == frames("FINAL", "ID", "t")  # no body: no empty frame


@spec("Status codes")
def test_no_worker_is_503_cancel_is_499_and_the_deadline_504_each_telling_the_worker(peer: Callable[..., Peer]) -> None:
    client = peer()
    assert error_of(client.ask("REQUEST", "SERVICE", "conf.nobody", "ID", "a")) == (
        503,
        "no worker for conf.nobody",
        "a",
    )
    worker = serve(peer, "conf.slow")
    client.send("REQUEST", "SERVICE", "conf.slow", "ID", "b")
    bid = work(worker).id
    client.send("CANCEL", "ID", "b")
    assert error_of(client.recv_skipping_noop())[0::2] == (499, "b")
    assert worker.recv_skipping_noop() == frames("CANCEL", "ID", str(bid))
    client.send("REQUEST", "SERVICE", "conf.slow", "ID", "c", "TIMEOUT", "300")
    bid = work(worker).id
    assert error_of(client.recv_skipping_noop())[0::2] == (504, "c")
    assert worker.recv_skipping_noop() == frames("CANCEL", "ID", str(bid))


@spec("Status codes")
@pytest.mark.parametrize("sent", [*sorted(P.WORKER_CODES), 401, 499, 502, 503, 504, 505, 507, "abc"])
def test_a_workers_error_keeps_its_code_only_when_an_application_may_mean_it(
    peer: Callable[..., Peer], sent: int | str
) -> None:
    worker, client = serve(peer, "conf.fail"), peer()
    client.send("REQUEST", "SERVICE", "conf.fail", "ID", "f")
    worker.send("ERROR", "ID", str(work(worker).id), "CODE", str(sent), "MESSAGE", "why")
    code, reason, rid = error_of(client.recv_skipping_noop())
    if sent in P.WORKER_CODES:
        assert (code, reason, rid) == (sent, "why", "f")
    else:
        assert (code, reason, rid) == (500, f"[worker sent code '{sent}'] why", "f")


@spec("Status codes")
def test_a_worker_lost_after_a_partial_is_502(peer: Callable[..., Peer]) -> None:
    worker, client = serve(peer, "conf.lost"), peer()
    client.send("REQUEST", "SERVICE", "conf.lost", "ID", "l")
    worker.send("PARTIAL", "ID", str(work(worker).id), "", "half")
    assert client.recv_skipping_noop() == frames("PARTIAL", "ID", "l", "", "half")
    worker.ask("DISCONNECT", "ID", "bye")
    assert error_of(client.recv_skipping_noop())[0::2] == (502, "l")


@spec("Limits and defaults", "Headers")
def test_capacity_defaults_to_1_and_is_at_most_the_tables_value(peer: Callable[..., Peer]) -> None:
    most = limit("max_capacity")
    one = peer()
    assert one.ask("READY", "ID", "r", "CAPACITY", str(most), "", "conf.cap") == frames("OK", "ID", "r")
    assert error_of(one.ask("READY", "ID", "r", "CAPACITY", str(most + 1), "", "conf.cap")) == (
        400,
        f"CAPACITY {most + 1} exceeds {most}",
        "r",
    )
    assert error_of(one.ask("READY", "ID", "r", "CAPACITY", "0", "", "conf.cap"))[0] == 400
    assert limit("default CAPACITY") == 1
    worker, client = serve(peer, "conf.one"), peer()
    client.send("REQUEST", "SERVICE", "conf.one", "ID", "1")
    client.send("REQUEST", "SERVICE", "conf.one", "ID", "2")
    first = work(worker)
    assert worker.nothing(0.3)  # one at a time
    worker.send("FINAL", "ID", str(first.id))
    assert work(worker).id != first.id


@spec("Limits and defaults", "Headers")
def test_service_and_group_names_are_bounded_by_the_table(peer: Callable[..., Peer]) -> None:
    one = peer()
    service, group = limit("service name"), limit("group name")
    assert one.ask("READY", "ID", "r", "", "s" * service) == frames("OK", "ID", "r")
    assert error_of(one.ask("READY", "ID", "r", "", "s" * (service + 1)))[0] == 400
    assert one.ask("SUB", "ID", "g", "GROUP", "g" * group, "", "grp.x") == frames("OK", "ID", "g")
    assert error_of(one.ask("SUB", "ID", "g", "GROUP", "g" * (group + 1), "", "grp.x"))[0] == 400
    assert error_of(one.ask("READY", "ID", "b", "", "mc0.broker")) == (
        403,
        "service mc0.broker is the broker's own",
        "b",
    )


@spec("Headers", "Verbs")
def test_scatter_gather_answers_per_worker_then_counts(peer: Callable[..., Peer]) -> None:
    workers = [serve(peer, "conf.all") for _ in range(2)]
    client = peer()
    client.send("REQUEST", "SERVICE", "conf.all", "ID", "s", "ALL", "1", "", "q")
    for worker in workers:
        worker.send("FINAL", "ID", str(work(worker).id), "", "a")
    for _ in workers:
        got = parsed(client.recv_skipping_noop())
        assert got.verb is Verb.PARTIAL and got.id == "s" and got.headers["WORKER"].startswith("anonymous#")
    assert client.recv_skipping_noop() == frames("FINAL", "ID", "s", "COUNT", "2", "MISSING", "0")


@spec("Verbs")
def test_ready_with_no_services_withdraws_the_worker(peer: Callable[..., Peer]) -> None:
    worker, client = serve(peer, "conf.drain"), peer()
    assert worker.ask("READY", "ID", "d") == frames("OK", "ID", "d")
    assert error_of(client.ask("REQUEST", "SERVICE", "conf.drain", "ID", "x"))[0] == 503


# ------------------------------------------------------------ batched framing
def blob_of(message: list[bytes]) -> bytes:
    assert batch.is_batch(message) and len(message) == 3, message
    return message[2]


def commands_of(blob: bytes) -> list[list[bytes]]:
    return [batch.frames_of(blob, code, start, end) for code, start, end in batch.records(blob)]


def batched_peer(peer: Callable[..., Peer]) -> Peer:
    one = peer(connected=False)
    first = one.hello("BATCH", "1")
    assert first == frames("OK", "ID", "c", "TTL", "5000", "BATCH", "1")  # a plain message, not a BATCH
    return one


@spec("The start-up, exactly as the broker does it", "Batched framing (protocol 1.0, optional)")
def test_the_ok_that_grants_batches_is_plain_and_what_follows_may_be_batched(peer: Callable[..., Peer]) -> None:
    one = batched_peer(peer)
    one.send("SUB", "ID", "s", "", "batch.x")  # a plain command: still valid
    assert commands_of(blob_of(one.recv_skipping_noop())) == [frames("OK", "ID", "s")]
    one.send(*batch.batch_frames(batch.put_record(b"batch.x", b"hi") + batch.record_of(frames("NOOP", "ID", "n"))))
    got: list[list[bytes]] = []
    while len(got) < 2:
        got += commands_of(blob_of(one.recv_skipping_noop()))
    assert got == [frames("MESSAGE", "TOPIC", "batch.x", "SENDER", "anonymous", "", "hi"), frames("OK", "ID", "n")]


@spec("The start-up, exactly as the broker does it")
def test_a_batch_before_it_was_granted_is_400_and_without_id_it_is_granted_silently(peer: Callable[..., Peer]) -> None:
    early = peer()
    assert error_of(early.ask(*batch.batch_frames(batch.put_record(b"t", b"x")))) == (
        400,
        "BATCH needs CONNECT ... BATCH 1 first",
        None,
    )
    silent = peer(connected=False)
    silent.send("CONNECT", "VERSION", "1.0", "BATCH", "1")
    assert silent.nothing(0.3)
    silent.send("NOOP", "ID", "n")
    assert commands_of(blob_of(silent.recv_skipping_noop())) == [frames("OK", "ID", "n")]


@spec("Records")
def test_every_command_may_travel_as_a_frames_record_and_a_bad_record_costs_itself_only(
    peer: Callable[..., Peer],
) -> None:
    one = batched_peer(peer)
    blob = b"".join(
        batch.frames_record(frames(*command))
        for command in (
            ("SUB", "ID", "s", "", "rec.x"),
            ("MESSAGE", "TOPIC", "rec.x", "ID", "m", "", "x"),  # a shortcut's command a peer does not send
            ("PUT", "TOPIC", "rec.x", "ID", "p", "", "x"),
        )
    )
    blob += struct.pack("<IB", 2, batch.PUT) + b"\x05"  # shorter than its fixed fields
    one.send(*batch.batch_frames(blob))
    got: list[list[bytes]] = []
    while len(got) < 5:
        got += commands_of(blob_of(one.recv_skipping_noop()))
    assert got[0] == frames("OK", "ID", "s")
    assert error_of(got[1]) == (400, "MESSAGE is not sent by a peer", "m")
    assert sorted(map(bytes, (got[2][0], got[3][0]))) == [b"MESSAGE", b"OK"]  # its own publication, and the OK
    assert error_of(got[4])[:2] == (400, "batch record too short for its fields")
    one.send(*batch.batch_frames(struct.pack("<IB", 99, batch.OK) + b"x"))  # a size past the end
    (answer,) = commands_of(blob_of(one.recv_skipping_noop()))
    assert error_of(answer)[0] == 400


# ------------------------------------------------------------ the worked examples, as printed
def words(text: str) -> list[bytes]:
    """Frames of an example line: each word a frame, ``""`` an empty frame, ``"a b"`` one with a space."""
    return [
        (m.group(1) if m.group(1) is not None else m.group(2)).encode() for m in re.finditer(r'"([^"]*)"|(\S+)', text)
    ]


@dataclass
class Play:
    """The peers of a worked example, and the request ids the broker chose (``17`` in the text)."""

    sockets: dict[str, Peer]
    chosen: dict[bytes, bytes] = field(default_factory=dict)

    def expect(self, who: str, wanted: list[bytes]) -> None:
        got = parsed(self.sockets[who].recv_skipping_noop())
        want = parsed(wanted)
        if want.verb is Verb.REQUEST:  # the broker's request id and the time left are its own
            self.chosen[want.headers["ID"].encode()] = str(got.id).encode()
            assert 0 < int(got.headers["TIMEOUT"]) <= int(want.headers["TIMEOUT"])
            want.headers.update(ID=str(got.id), TIMEOUT=got.headers["TIMEOUT"])
        assert (got.verb, got.headers, list(got.payload)) == (want.verb, want.headers, list(want.payload))

    def send(self, who: str, sent: list[bytes]) -> None:
        self.sockets[who].send(*[self.chosen.get(part, part) for part in sent])


@spec("Worked examples", "Publish, subscribe, call")
def test_the_worked_example_plays_as_printed(peer: Callable[..., Peer]) -> None:
    (block,) = code_blocks("Publish, subscribe, call")
    play = Play({})
    for line in block.splitlines():
        match = re.match(r"^(B→)?([A-Z]): (.*)$", line)
        assert match is not None, line
        who = match.group(2)
        if who not in play.sockets:
            play.sockets[who] = peer(connected=False)
        if match.group(1):
            play.expect(who, words(match.group(3)))
        else:
            play.send(who, words(match.group(3)))
    for one in play.sockets.values():
        assert one.nothing(0.2)


def record_line(text: str) -> tuple[bytes, list[bytes]]:
    """An indented line of the batched example: the record's bytes (hex pairs and quoted text), and the
    command its ``# NAME: ...`` comment says it stands for."""
    data, _, comment = text.partition("#")
    record = b"".join(
        bytes.fromhex(m.group(2)) if m.group(2) else m.group(1).encode()
        for m in re.finditer(r'"([^"]*)"|\b([0-9a-f]{2})\b', data)
    )
    return record, words(comment.split(":", 1)[1])


@spec("Worked examples", "The batched wire", "Records")
def test_the_batched_example_plays_as_printed_byte_for_byte(peer: Callable[..., Peer]) -> None:
    (block,) = code_blocks("The batched wire")
    one = peer(connected=False)
    steps: list[tuple[bool, list[bytes], bytes]] = []  # (the broker sends it, the frames, the blob)
    for line in block.splitlines():
        if line.startswith(" "):
            record, command = record_line(line)
            ((code, start, end),) = batch.records(record)
            assert batch.frames_of(record, code, start, end) == command, line  # the record is the command
            steps[-1] = (steps[-1][0], steps[-1][1], steps[-1][2] + record)
        else:
            match = re.match(r"^(B→)?C: (.*)$", line)
            assert match is not None, line
            steps.append((bool(match.group(1)), words(match.group(2).replace("<blob>", "")), b""))
    for from_broker, message, blob in steps:
        if not from_broker:
            one.send(*(message[:2] + [blob] if blob else message))
        elif not blob:
            assert one.recv_skipping_noop() == message  # the OK: plain
        else:
            got = b""
            while len(got) < len(blob):  # (the broker may split the records between batches)
                got += blob_of(one.recv_skipping_noop())
            assert got == blob
    assert one.nothing(0.2)


# ------------------------------------------------------------ security
@dataclass
class Secure:
    broker: BrokerProcess
    keys_dir: Path
    allowed: Path

    def pair(self, name: str) -> tuple[bytes, bytes]:
        loaded = keys.load_secret(self.keys_dir / f"{name}.key_secret")
        assert loaded.secret is not None
        return loaded.public, loaded.secret

    def peer(self, context: zmq.Context[Any], name: str, server: bytes | None = None) -> Peer:
        public, secret = self.pair(name)
        broker_key = keys.load_public(self.keys_dir / "broker.key").public
        return Peer(self.broker.endpoint, context, (server or broker_key, public, secret))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """A CURVE broker: alice allowed as alice.key, carol's key allowed under the name dave.key, eve allowed
    (to be revoked), mallory's key never."""
    root = tmp_path_factory.mktemp("curve")
    keys_dir, allowed = root / "keys", root / "keys" / "allowed"
    for name in ("alice", "carol", "eve", "mallory"):
        keys.create(keys_dir, name)
    allowed.mkdir()
    for name, as_name in (("alice", "alice"), ("carol", "dave"), ("eve", "eve")):
        (allowed / f"{as_name}.key").write_bytes((keys_dir / f"{name}.key").read_bytes())
    config = root / "mc0.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys_dir}"\nallowed_dir = "{allowed}"\nreload_ms = 100\n')
    with BrokerProcess(config=str(config), cwd=str(root), start_timeout=60) as broker:
        yield Secure(broker, keys_dir, allowed)


@spec("Security: CURVE and key files", "Key files")
def test_the_identity_is_the_allowed_files_name_not_the_certificates(secure: Secure, context: zmq.Context[Any]) -> None:
    carol, alice = secure.peer(context, "carol"), secure.peer(context, "alice")
    try:
        assert "carol" in (secure.keys_dir / "carol.key").read_text()  # the certificate's metadata name
        for one in (carol, alice):
            assert one.hello() == frames("OK", "ID", "c", "TTL", "5000")
        assert alice.ask("SUB", "ID", "s", "", "who.x") == frames("OK", "ID", "s")
        carol.send("PUT", "TOPIC", "who.x", "", "hi")
        assert parsed(alice.recv_skipping_noop()).headers["SENDER"] == "dave"
        assert alice.ask("READY", "ID", "r", "", "who.svc") == frames("OK", "ID", "r")
        carol.send("REQUEST", "SERVICE", "who.svc", "ID", "q")
        assert work(alice).headers["CALLER"] == "dave"
    finally:
        carol.close()
        alice.close()


@spec("A refused key")
def test_a_refused_key_is_told_only_by_the_sockets_handshake_event(secure: Secure, context: zmq.Context[Any]) -> None:
    mallory = secure.peer(context, "mallory")
    try:
        mallory.offer("CONNECT", "VERSION", "1.0", "ID", "c")
        seen = mallory.events(20.0, until=lambda seen: any(e == zmq.EVENT_HANDSHAKE_FAILED_AUTH for e, _ in seen))
        assert (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400) in seen, seen
        after = mallory.events(1.0)  # libzmq would try again within 0.1 s: it does not
        assert zmq.EVENT_CONNECTED not in [event for event, _ in after], after
        assert not mallory.socket.poll(0)  # and no mc0 message ever came
    finally:
        mallory.close()


@spec("A refused key")
def test_a_wrong_broker_key_fails_with_no_detail_again_and_again(secure: Secure, context: zmq.Context[Any]) -> None:
    wrong = secure.peer(context, "alice", server=secure.pair("mallory")[0])
    try:
        wrong.offer("CONNECT", "VERSION", "1.0", "ID", "c")

        def failures(seen: list[tuple[int, int]]) -> int:
            return [event for event, _ in seen].count(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

        assert failures(wrong.events(20.0, until=lambda seen: failures(seen) >= 2)) >= 2  # it retries, and fails
        assert not wrong.socket.poll(0)
    finally:
        wrong.close()


@spec("A refused key")
def test_no_curve_against_a_curve_broker_fails_with_protocol(secure: Secure, context: zmq.Context[Any]) -> None:
    bare = Peer(secure.broker.endpoint, context, monitored=True)
    handshake = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_SUCCEEDED}
    try:
        bare.offer("CONNECT", "VERSION", "1.0", "ID", "c")
        seen = bare.events(30.0, until=lambda seen: any(event in handshake for event, _ in seen))
        assert [event for event, _ in seen if event in handshake] == [zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL], seen
        assert not bare.socket.poll(500)
    finally:
        bare.close()


@spec("A refused key", "How a session ends")
def test_a_revoked_key_gets_401_key_revoked_and_nothing_more(secure: Secure, context: zmq.Context[Any]) -> None:
    eve = secure.peer(context, "eve")
    try:
        assert eve.hello() == frames("OK", "ID", "c", "TTL", "5000")
        (secure.allowed / "eve.key").unlink()
        assert error_of(eve.recv_skipping_noop(15)) == (401, "key revoked", None)
        eve.send("NOOP", "ID", "n")
        assert eve.nothing(0.5)
    finally:
        eve.close()


# ------------------------------------------------------------ last: every section has its case
def test_every_client_section_has_a_case_and_every_case_names_a_real_section() -> None:
    titles = {title for _, title in headings()}
    assert not set(COVERED) - titles, f"cases name sections the spec lacks: {set(COVERED) - titles}"
    missing = [title for title in client_sections() if title not in COVERED]
    assert not missing, f"sections of the spec's client part with no conformance case: {missing}"
