"""The JetStream wing: journals, durable consumers and mailboxes kept by JetStream (``store = "jetstream"``).

One folder for everything JetStream-only (as nats.py has ``js/``), its modules on the floors their
work puts them (tests/test_architecture.py assigns each by name):

- core (pure, no I/O): :mod:`.replication` (OKs held until the stream acknowledges; records it
  delivers fanned out), :mod:`.storecalls` (what the core asks of JetStream besides records),
  :mod:`.storeconsumers` (durable consumers of a JetStream journal), :mod:`.storedletters`
  (mailboxes kept in a stream), :mod:`.fromstore` (the entry points the shell hands JetStream's news to);
- storage: :mod:`.replicated` (``ReplicatedJournal``: the store port over a local copy of the stream);
- cluster (the link thread, nats-py): :mod:`.linkpart` (``JetStreamPart``: streams made, proposals
  published, feeds and store calls run), :mod:`.feed` (``StreamFeed``: the stream into the local copy),
  :mod:`.storeops` (``StoreOps``: the store calls through the JetStream API), :mod:`.streams` (each
  journal's stream, and what crosses the link's PAIRs for JetStream);
- shell: :mod:`.journalcopy` (``mc0 journal copy``).

The layout of a JetStream journal's messages is wire, kept with the rest of the wire in
:mod:`mc0.protocol.jetstream`.
"""
