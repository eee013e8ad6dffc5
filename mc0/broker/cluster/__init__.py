"""The cluster link: brokers joined over a NATS cluster (``[cluster]``; docs/ARCHITECTURE.md "The cluster").

Each other broker is one *route* peer in the local core (:mod:`mc0.broker.core.routes`
decides what crosses: interest, services, identities, messages, requests); this
package is the shell that carries route traffic over NATS: :mod:`.link` (a thread
with nats-py, bridged to the broker loop), and, for journals kept by JetStream, the
JetStream part on the same connection and thread (:mod:`mc0.broker.jetstream`).
Subjects, beacons and the frame around a route's batch are protocol:
:mod:`mc0.protocol.routes`.  Without ``[cluster]`` none of it runs.
"""
