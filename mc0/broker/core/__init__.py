"""The broker's pure core: every protocol decision, no sockets, no clock, no disk.

Rooms, each owning one kind of state: :mod:`.peers` (connections, liveness),
:mod:`.pubsub` (subscriptions, queue groups, fan-out), :mod:`.rpc` with
:mod:`.jobs` (services, workers, requests: one state machine),
:mod:`.journaling` (journal appends, held OKs, replays, fetches),
:mod:`.mailboxes`, :mod:`.consumers` (durable consumers),
:mod:`.builtin_services` (``mc0.broker``, ``mmi.service``, ``mc0.journal``),
:mod:`.sysbus` and :mod:`.telemetry` (the broker's own ``mc0.sys.*``
publications), :mod:`.histogram`; for journals JetStream keeps, the pure
rooms of the JetStream wing (:mod:`mc0.broker.jetstream`: replication,
storecalls, storeconsumers, storedletters, fromstore) are on this floor too.  :mod:`.dispatch` holds ``BrokerCore``,
the verb table that ties them together (:mod:`.verbs`, :mod:`.batched`).

Rule (checked by tests/test_architecture.py): the core imports only the
layers below the broker (protocol, topics, trie, permissions, settings, ...)
and, of the broker, only the storage port (:mod:`mc0.broker.storage.port`).
The shell (:mod:`mc0.broker.server`) hands in what the core cannot import,
such as the foreign-dialect router.
"""
