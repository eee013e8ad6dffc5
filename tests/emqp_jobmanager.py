"""eventmq's own JobManager (the real package, unchanged) serving queue QUEUE on a broker: the
eMQP interop test runs it as a process.  Usage: python emqp_jobmanager.py ENDPOINT QUEUE"""

from __future__ import annotations

import sys

from eventmq import conf  # type: ignore[import-untyped]
from eventmq.jobmanager import JobManager  # type: ignore[import-untyped]

if __name__ == "__main__":
    conf.CONCURRENT_JOBS = 2
    JobManager(queues=[(10, sys.argv[2])]).jobmanager_main(broker_addr=sys.argv[1])
