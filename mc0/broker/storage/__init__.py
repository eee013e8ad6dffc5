"""Storage behind the core's journal port, named in pairs as nats-server pairs memstore/filestore.

:mod:`.port` is the interface the core talks to (``JournalStore``, ``Trimmed``,
``StateUnreadable``); :mod:`.memstore` keeps records in a list (tests, the
fuzzer); :mod:`.filestore` is the segment-file journal with CRC recovery and
fsync policies, and :mod:`.consumerfiles` keeps durable consumers' state on
disk beside it; :mod:`.records` is the record codec.  A journal JetStream
keeps, read through a local copy, is :mod:`mc0.broker.jetstream.replicated`.
Rule: storage imports only the layers below the broker.
"""
