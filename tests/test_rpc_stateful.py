"""A stateful property test of the RPC core: random REQUEST / CANCEL / READY / PARTIAL / FINAL /
ERROR / DISCONNECT / vanish / time, and every request gets exactly one terminal, nothing after it."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.protocol import Side, Verb

CLIENTS = ("c1", "c2")
WORKERS = ("w1", "w2", "w3")
SERVICES = ("s1", "s2")


def f(*parts: str) -> list[bytes]:
    return [p.encode() for p in parts]


class RpcMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = BrokerCore(CoreSettings(max_attempts=2, max_queue=5, request_timeout_ms=1000, min_ttl_ms=100))
        self.now = 0.0
        self.serial = 0
        self.connected: set[str] = set()
        self.open: dict[str, str] = {}  # rid -> client, no terminal yet
        self.ended: dict[str, int] = {}  # rid -> terminals seen
        self.late: list[tuple[str, str]] = []  # (rid, verb) seen after its terminal
        self.orphans: set[str] = set()  # rids whose client went away (no terminal owed)
        self.held: dict[str, list[str]] = {w: [] for w in WORKERS}  # bids each worker was given
        for name in (*CLIENTS, *WORKERS):
            self._connect(name)

    # ---------------------------------------------------------------- plumbing
    def _connect(self, name: str) -> None:
        self._apply(self.core.handle(name.encode(), f("CONNECT", "VERSION", "1.0", "TTL", "1000"), self.now, name))
        self.connected.add(name)

    def _send(self, name: str, *frames: str) -> None:
        self._apply(self.core.handle(name.encode(), f(*frames), self.now, name))

    def _apply(self, out: list[tuple[bytes, object]]) -> None:
        for rid_bytes, frames in out:
            who = rid_bytes.decode()
            command = P.decode(frames, sender=Side.BROKER)  # type: ignore[arg-type]
            if who in WORKERS and command.verb is Verb.REQUEST:
                self.held[who].append(command.headers["ID"])
                continue
            if who not in CLIENTS or command.id is None or command.id not in self.ended:
                continue
            rid = command.id
            if command.verb is Verb.PARTIAL:
                if self.ended[rid]:
                    self.late.append((rid, "PARTIAL"))
            elif command.verb in (Verb.FINAL, Verb.ERROR):
                if self.ended[rid] or rid in self.orphans:
                    self.late.append((rid, command.verb.value))
                self.ended[rid] += 1
                self.open.pop(rid, None)

    def _gone(self, name: str) -> None:
        self.connected.discard(name)
        if name in CLIENTS:
            for rid, client in list(self.open.items()):
                if client == name:
                    del self.open[rid]
                    self.orphans.add(rid)
        else:
            self.held[name].clear()

    # ---------------------------------------------------------------- rules
    @rule(
        client=st.sampled_from(CLIENTS),
        service=st.sampled_from(SERVICES),
        timeout=st.integers(50, 2000),
        scatter=st.booleans(),
    )
    def request(self, client: str, service: str, timeout: int, scatter: bool) -> None:
        if client not in self.connected:
            self._connect(client)
        self.serial += 1
        rid = f"r{self.serial}"
        self.open[rid] = client
        self.ended[rid] = 0
        self._send(client, "REQUEST", "SERVICE", service, "ID", rid, "TIMEOUT", str(timeout), "ALL", "01"[scatter])

    @precondition(lambda self: bool(self.ended))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ended)))
        client = self.open.get(rid) or data.draw(st.sampled_from(CLIENTS))
        if client in self.connected:
            self._send(client, "CANCEL", "ID", rid)

    @rule(
        worker=st.sampled_from(WORKERS),
        services=st.lists(st.sampled_from(SERVICES), min_size=1, max_size=2, unique=True),
        capacity=st.integers(1, 3),
    )
    def ready(self, worker: str, services: list[str], capacity: int) -> None:
        if worker not in self.connected:
            self._connect(worker)
        self._send(worker, "READY", "CAPACITY", str(capacity), "", *services)

    @rule(worker=st.sampled_from(WORKERS), verb=st.sampled_from(["PARTIAL", "FINAL", "ERROR"]), data=st.data())
    def reply(self, worker: str, verb: str, data: st.DataObject) -> None:
        if worker not in self.connected:
            return
        held = self.held[worker]
        bid = data.draw(st.sampled_from(held)) if held else "999999"  # a forged id must be dropped
        if verb == "ERROR":
            code = data.draw(st.sampled_from(["500", "401", "404", "x"]))
            self._send(worker, "ERROR", "ID", bid, "CODE", code, "MESSAGE", "m")
        else:
            self._send(worker, verb, "ID", bid, "", "body")

    @rule(name=st.sampled_from((*CLIENTS, *WORKERS)), how=st.sampled_from(["disconnect", "vanish"]))
    def leave(self, name: str, how: str) -> None:
        if name not in self.connected:
            return
        if how == "disconnect":
            self._send(name, "DISCONNECT")
        else:
            self._apply(self.core.send_failed(name.encode(), self.now, unreachable=True))
        self._gone(name)

    @rule(dt=st.floats(0.0, 1.5))
    def advance(self, dt: float) -> None:
        self.now += dt
        for name in list(self.connected):  # everyone still here heartbeats
            self._send(name, "NOOP")
        self._apply(self.core.tick(self.now))

    # ---------------------------------------------------------------- properties
    @invariant()
    def at_most_one_terminal_and_nothing_after(self) -> None:
        assert self.late == []
        assert all(count <= 1 for count in self.ended.values())

    def teardown(self) -> None:
        # Let every deadline pass with everyone alive: each request of a present client is answered.
        for _ in range(4):
            self.now += 1.0
            for name in list(self.connected):
                self._send(name, "NOOP")
            self._apply(self.core.tick(self.now))
        self.at_most_one_terminal_and_nothing_after()
        owed = {rid for rid, client in self.open.items() if client in self.connected}
        assert owed == set(), f"no terminal for {sorted(owed)}"


RpcMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_rpc_lifecycle = RpcMachine.TestCase
