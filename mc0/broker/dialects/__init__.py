"""Foreign dialects: which one a message speaks, and the handler that takes it.

Contract: ``recognise(frames, peer)`` returns the ``handle`` function of the
foreign dialect ``frames`` belong to (MDP/0.2, seed 000, eMQP, DCP), or None
for mc0's own protocol.  Each handler has the signature of
:data:`~mc0.broker.dialects.base.Handler` and drives the core through
:class:`~mc0.broker.dialects.base.CoreOps`; the shell hands ``recognise`` to
``BrokerCore`` (the core never imports a dialect).  Recognition looks at
the first frame(s) only, so it costs a few byte comparisons per message.
MemoDB (:mod:`.memodb`) arrives over NNG, not the ROUTER, so it is not
recognised here.  Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.peers import Peer
from . import dcp, emqp, mdp, mdpx
from .base import Handler


def recognise(frames: Sequence[bytes], peer: Peer | None) -> Handler | None:
    """The foreign dialect handling ``frames`` (non-empty) from ``peer``, or None (mc0)."""
    # Seed 000 first: its workers say DISCONNECT with MDP/0.2's worker header.
    if mdpx.is_mdpx(frames, peer):
        return mdpx.handle
    if dcp.is_dcp(frames):
        return dcp.handle
    if emqp.is_emqp(frames):
        return emqp.handle
    if mdp.is_mdp(frames):
        return mdp.handle
    return None
