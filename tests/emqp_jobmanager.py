"""eventmq's own JobManager (the real package, unchanged) serving queue QUEUE on a broker: the
eMQP interop tests run it as a process.  Usage: python emqp_jobmanager.py ENDPOINT QUEUE [SECRET BROKER]

With SECRET (a client's ``.key_secret`` file) and BROKER (the broker's ``.key``), its socket gets
CURVE keys through eventmq's own handle on it (``JobManager.outgoing.zsocket``) before it
connects: no change to eventmq.  (eventmq's reset() after a lost broker builds a new socket
without them; a CURVE deployment restarts the JobManager instead.)"""

from __future__ import annotations

import sys

from eventmq import conf  # type: ignore[import-untyped]
from eventmq.jobmanager import JobManager  # type: ignore[import-untyped]

if __name__ == "__main__":
    conf.CONCURRENT_JOBS = 2
    manager = JobManager(queues=[(10, sys.argv[2])])
    if len(sys.argv) > 4:
        from mc0 import keys

        own, broker = keys.load_secret(sys.argv[3]), keys.load_public(sys.argv[4])
        socket = manager.outgoing.zsocket
        socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = broker.public, own.public, own.secret
    manager.jobmanager_main(broker_addr=sys.argv[1])
