"""Foreign dialects: which one a message speaks, and the handler that takes it.

Contract: ``route(frames, peer)`` returns the ``handle`` function of the
foreign dialect ``frames`` belong to (MDP/0.2, seed 000, eMQP, DCP), or None
for mc0's own protocol.  Each handler has the signature of
:func:`mc0.broker.mdp.handle` and drives the core through
:class:`~mc0.broker.mdp.CoreOps`.  Recognition looks at the first frame(s)
only, so it costs a few byte comparisons per message.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import dcp, emqp, mdp, seed000
from .peers import Out, Peer

if TYPE_CHECKING:
    from .mdp import CoreOps

Handler = Callable[["CoreOps", "Peer | None", bytes, Sequence[bytes], float, str, "int | None"], list[Out]]


def route(frames: Sequence[bytes], peer: Peer | None) -> Handler | None:
    """The foreign dialect handling ``frames`` (non-empty) from ``peer``, or None (mc0)."""
    # Seed 000 first: its workers say DISCONNECT with MDP/0.2's worker header.
    if seed000.is_seed000(frames, peer):
        return seed000.handle
    if dcp.is_dcp(frames):
        return dcp.handle
    if emqp.is_emqp(frames):
        return emqp.handle
    if mdp.is_mdp(frames):
        return mdp.handle
    return None
