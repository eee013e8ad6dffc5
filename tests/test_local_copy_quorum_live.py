"""Issue 40: after JetStream lost and regained its quorum, a replay at another broker serves every
acknowledged record; and a copy that cannot catch up says so.  Three real nats-server nodes, mc0 broker
processes (A, B and C, each on its own node first), R3 JetStream journals.

The issue's scenario, run 21 times over one NATS cluster and one set of brokers (a run of its own cost
~15 s, mostly starting a cluster and brokers): each run has a journal (a stream) that nothing was written
to before it, as each of the issue's runs had.  A PUT at A is acknowledged; two NATS nodes are killed
(kill -9) and a PUT at A is refused; one of them is started again and the same PUT (MSGID) is sent again
until acknowledged; a SUB FROM 0 at B must receive both records, at the seqs their OKs named, and no
ERROR.  Seven runs share each NATS outage (their streams elect their leaders, and B's feeds make their
consumers, each on its own); the three outages leave B's own node up, kill it and start it again first,
and kill it and start it again second.  Between two outages the third node is started again and the
cluster made whole.
"""

from __future__ import annotations

import datetime
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import mc0
from mc0.natsproc import NatsCluster
from mc0.protocol.jetstream import COPY_STATES

from .clusterbus import ClusterBus
from .clusterbus import until as poll
from .test_jetstream_faults import nats_api, started
from .test_jetstream_live import confirmed, journal, received

# (killed, started again first), for B (broker 1, on node 1 first): its node survives; its node is killed and
# started again first; its node is killed and started again second.
OUTAGES = [((0, 2), 0), ((0, 1), 1), ((1, 2), 2)]
RUNS_PER_OUTAGE = 7
RUNS = len(OUTAGES) * RUNS_PER_OUTAGE
TIMEOUT_MS = 1000  # [cluster] jetstream_timeout_ms: how long a PUT waits for JetStream before 504/507
# Each outage's bounds (polled conditions, not sleeps): a quorum back (a node's start and the streams'
# elections, ~2-6 s at load 10 here) and a replay's records (the 40 s); a loaded box takes several
# times the quiet one's.
QUORUM_BACK_S = 60.0
REPLAY_S = 40.0

pytestmark = [pytest.mark.timeout(60 + 60 * len(OUTAGES)), pytest.mark.long]


def test_after_nats_lost_and_regained_its_quorum_a_replay_at_another_broker_serves_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    nats = started(tmp_path)
    extra = f"jetstream_timeout_ms = {TIMEOUT_MS}\n" + "".join(
        journal(f"q{k}", f'["o{k}.>"]').replace('fsync = "always"\n', "") for k in range(RUNS)
    )
    took: list[tuple[float, float, float]] = []
    failed: list[str] = []
    faults: list[Exception] = []
    try:
        with ClusterBus(tmp_path, nats, 3, extra=extra) as bus:
            bus.wait_joined()
            with bus.client(0) as a, bus.client(1, on_fault=faults.append) as b:
                for outage, (killed, first) in enumerate(OUTAGES):
                    runs = range(outage * RUNS_PER_OUTAGE, (outage + 1) * RUNS_PER_OUTAGE)
                    began = time.monotonic()
                    warm = {k: confirmed(a, f"o{k}.q", b"warm", msgid="warm") for k in runs}
                    for node in killed:
                        nats.kill(node)  # kill -9: no quorum now
                    with pytest.raises((mc0.StorageFailed, mc0.DeadlineExceeded)):
                        a.publish(f"o{runs[0]}.q", b"mq", confirm=True, msgid="mq", timeout=10)
                    nats.start_node(first)
                    back = time.monotonic()
                    mq = {k: confirmed(a, f"o{k}.q", b"mq", msgid="mq", within=QUORUM_BACK_S) for k in runs}
                    stored = time.monotonic()
                    assert all(mq[k].seq == warm[k].seq + 1 for k in runs)  # each stored once
                    replays = {k: b.subscribe(f"o{k}.>", from_seq=0, journal=f"q{k}") for k in runs}
                    where = f"n{killed[0] + 1} and n{killed[1] + 1} killed, n{first + 1} back first"
                    for k in runs:
                        got = replayed(replays[k], 2, within=REPLAY_S)
                        if got != [(warm[k].seq, b"warm"), (mq[k].seq, b"mq")]:
                            failed.append(f"run {k} ({where}): B's replay got {got}")
                        if not replays[k].closed:
                            b.unsubscribe(replays[k])
                    served = time.monotonic()
                    took.append((stored - back, served - stored, served - began))
                    nats.start_node(next(n for n in killed if n != first))
                    nats.wait_ready(QUORUM_BACK_S)  # (the whole cluster for the next outage)
    finally:
        nats.stop()
        print(f"{len(failed)} of {len(took) * RUNS_PER_OUTAGE} runs failed: {failed}")
        if took:
            quorum, replays_took, outages = zip(*took, strict=True)
            print(
                f"{len(took)} outages of {RUNS_PER_OUTAGE} runs: every PUT acknowledged again "
                f"{min(quorum):.2f}-{max(quorum):.2f} s after a node came back, B's replays served in "
                f"{min(replays_took):.2f}-{max(replays_took):.2f} s, an outage took "
                f"{min(outages):.2f}-{max(outages):.2f} s"
            )
    assert failed == [] and faults == []


def replayed(subscription: mc0.Subscription, count: int, within: float) -> list[tuple[int, bytes]] | str:
    """(seq, body) of the first ``count`` messages of a replay, or the error that ended it."""
    try:
        return received(subscription, count, within)
    except mc0.ClosedError as ended:
        return f"ended: {ended}"


def page(bus: ClusterBus, i: int, path: str) -> Any:
    """Broker ``i``'s monitoring page (``http=True``): JSON, or /metrics' samples by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.http_ports[i]}{path}", timeout=5) as answer:
        text = answer.read().decode()
    if path != "/metrics":
        return json.loads(text)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def copy_of(bus: ClusterBus, i: int, name: str) -> dict[str, Any]:
    """Journal ``name``'s row of broker ``i``'s /journalz, with its /metrics gauges (lag, state)."""
    (row,) = [r for r in page(bus, i, "/journalz")["journals"] if r["name"] == name]
    samples = page(bus, i, "/metrics")
    states = [s for s in COPY_STATES if samples[("mc0_journal_copy_state", (("journal", name), ("state", s)))] == 1]
    return {**row, "gauge_lag": samples[("mc0_journal_copy_lag", (("journal", name),))], "gauge_states": states}


def pause_feeds(nats: NatsCluster, stream: str) -> None:
    """Pause every consumer of ``stream`` (the brokers' feeds): each heartbeats and delivers nothing."""
    until = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
    names = [c["name"] for c in nats_api(nats, f"CONSUMER.LIST.{stream}").get("consumers") or []]
    for name in names:
        assert nats_api(nats, f"CONSUMER.PAUSE.{stream}.{name}", {"pause_until": until}).get("paused") is True
    for name in names:  # until the node that runs each says it is paused (polled, bounded)
        poll(lambda n=name: nats_api(nats, f"CONSUMER.INFO.{stream}.{n}").get("paused") is True, 20, "paused")


def test_a_copy_that_cannot_catch_up_says_so_on_its_pages_in_its_log_and_to_a_replay_and_follows_again(
    tmp_path: Path,
) -> None:
    """Brokers A and B on a journal; B's feed paused and a PUT at B acknowledged (B's copy one record behind
    what B knows the stream holds), then two NATS nodes killed: B's copy is stuck, and says so: /journalz
    (state, lag 1, why), /metrics (the gauges), /healthz degraded, one line in its log.  A SUB FROM 0 at B
    gets the record its copy holds, then ERROR 504 naming why (not silence); so does one at broker C,
    started during the outage (its copy never learnt the stream: the issue's silent case).  A node back:
    B's copy follows again (lag 0, healthz ok, one line in its log), and C's copy serves every record."""
    nats = started(tmp_path)
    bus = ClusterBus(tmp_path, nats, 3, extra=journal("watched", '["w.>"]'), http=True)
    try:
        bus.start(0), bus.start(1)
        bus.wait_joined(among=(0, 1))
        with bus.client(0) as a, bus.client(1) as b:
            first = confirmed(a, "w.x", b"first")
            poll(lambda: copy_of(bus, 1, "watched")["copy_next_seq"] > first.seq, 30, "B's copy")
            poll(lambda: copy_of(bus, 1, "watched")["copy_state"] == "following", 30, "B's copy following")
            pause_feeds(nats, "MC0_J_watched")
            behind = confirmed(b, "w.x", b"behind")  # (B's own PUT: B knows the stream holds it)
            nats.kill(0)
            nats.kill(2)  # no quorum: no feed can be made again; B's node (1) stays
            bus.start(2)  # C: its copy has never learnt the stream's state
            with bus.client(2) as c:
                at_b = b.subscribe("w.>", from_seq=0, journal="watched")
                at_c = c.subscribe("w.>", from_seq=0, journal="watched")
                assert received(at_b, 1) == [(first.seq, b"first")]
                took = poll(lambda: copy_of(bus, 1, "watched")["copy_state"] == "stuck", 60, "B's copy stuck")
                stuck = copy_of(bus, 1, "watched")
                print(f"B's copy stuck {took:.1f} s after the outage began: {stuck}")
                assert (stuck["copy_lag"], stuck["gauge_lag"], stuck["gauge_states"]) == (1, 1, ["stuck"])
                assert stuck["copy_reason"] and stuck["copy_stuck_times"] == 1
                health = page(bus, 1, "/healthz")
                assert health["status"] == "degraded"
                assert health["reason"].startswith("journal watched: its local copy is stuck")
                ended = [ending(sub, 60) for sub in (at_b, at_c)]
            print(f"replays at the stuck copies: {ended}")
            stopped = (
                f"504 journal watched: this broker's copy did not reach seq {behind.seq + 1} within 10 s (its feed: "
            )
            assert stopped in ended[0]
            assert f"replay stopped at seq {behind.seq} (subscribe again FROM {behind.seq})" in ended[0]
            assert "504 journal watched: this broker's copy did not follow stream MC0_J_watched" in ended[1]
            nats.start_node(0)  # a quorum again
            poll(lambda: copy_of(bus, 1, "watched")["copy_state"] == "following", 60, "B's copy following again")
            again = copy_of(bus, 1, "watched")
            assert (again["copy_lag"], again["gauge_lag"], again["gauge_states"]) == (0, 0, ["following"])
            assert page(bus, 1, "/healthz") == {"status": "ok"}
            with bus.client(2) as c:
                replay = c.subscribe("w.>", from_seq=0, journal="watched")
                assert received(replay, 2, 30) == [(first.seq, b"first"), (behind.seq, b"behind")]
        log = bus.brokers[1].stderr_text()  # type: ignore[union-attr]
        assert log.count(f"journal watched: the local copy of stream MC0_J_watched is stuck at seq {first.seq} ") == 1
        assert log.count("journal watched: the local copy of stream MC0_J_watched is following again") == 1
    finally:
        bus.stop()
        nats.stop()


def ending(subscription: mc0.Subscription, within: float) -> str:
    """The error a replay ended with (it gets no more messages first), polled for at most ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            got = subscription.next_batch(10, timeout=0.2)
        except mc0.Timeout:
            continue
        except mc0.ClosedError as ended:
            return str(ended)
        raise AssertionError(f"a replay at a copy that cannot catch up got more: {got}")
    raise AssertionError(f"no replay error within {within} s")
