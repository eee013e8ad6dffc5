"""Monitoring: :mod:`.snapshot` copies the figures out of the core on the broker's loop (pure),
:mod:`.httpd` serves them over HTTP (``/varz``, ``/connz``, ``/metrics`` ...) from its own thread.

Rule: monitoring may import the core and the shell's outbox (it reports both); nothing in the
core imports monitoring.
"""
