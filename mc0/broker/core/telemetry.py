"""Telemetry records: what the broker publishes about itself on ``mc0.sys.*``.

Contract: the rooms describe what happened as small records (a finished
request, a peer that came or went); the rooms decide whether anyone
wants them (a subscriber or a journal, checked before a record is built)
and publishes each as one JSON body on its topic.  Pure: the wall-clock
time is ``now`` plus an offset the shell supplies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...protocol import SYS_PEER_TOPIC, SYS_RPC_TOPIC

BROKER_SENDER = "mc0.broker"  # the SENDER of everything the broker publishes


@dataclass(frozen=True, slots=True)
class RpcDone:
    """One finished request (any terminal: FINAL, ERROR, 499, 502, 503, 504)."""

    service: str
    caller: str
    worker: str | None
    latency_ms: float
    status: int
    bytes_in: int
    bytes_out: int

    topic = SYS_RPC_TOPIC

    def data(self) -> dict[str, object]:
        return {
            "service": self.service,
            "caller": self.caller,
            "worker": self.worker,
            "latency_ms": self.latency_ms,
            "status": self.status,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


@dataclass(frozen=True, slots=True)
class PeerEvent:
    """A peer connected or went away (``reason``: why it was forgotten)."""

    event: str
    peer: str
    identity: str
    kind: str
    protocol: str
    reason: str = ""

    topic = SYS_PEER_TOPIC

    def data(self) -> dict[str, object]:
        data: dict[str, object] = {
            "event": self.event,
            "peer": self.peer,
            "identity": self.identity,
            "kind": self.kind,
            "protocol": self.protocol,
        }
        if self.reason:
            data["reason"] = self.reason
        return data


TelemetryRecord = RpcDone | PeerEvent


def body(record: TelemetryRecord, wall_time: float) -> list[bytes]:
    """The record as one JSON frame, stamped with ``ts`` (wall-clock seconds)."""
    data = record.data()
    data["ts"] = round(wall_time, 6)
    return [json.dumps(data, separators=(",", ":")).encode()]
