"""Queue groups: which member of each matching group is handed a message.

Contract: :class:`GroupChoice` owns the turn each member was last chosen
and, per topic, the matching groups with their members (grouped once and
kept until the subscriptions change, which the caller says by passing
:class:`~mc0.broker.core.pubsub.PubSub`'s ``version``).  ``chosen`` returns
one member per matching group: the least recently chosen that may see the
message and ``can_take`` it (a predicate the shell sets from its outgoing
queues: a member whose queue is backing up is skipped while another can
take the message; when none can, the least recently chosen one still gets
it).  ``can_take`` is asked of that least recently chosen member first and
of the others only when it is backed up: once per group per message while
nobody is.  In a cluster a route is a member (its broker's members,
announced); a copy a route hands back (none of its members may take it) is
chosen again with :class:`HandedBack` (those routes passed over), and the
route is passed over for that topic and group while another member may take
it (``handed_back``: a hint kept as long as the topic's plan).  The
subscriptions themselves (the trie of members) are PubSub's.  Pure: no
sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from ...permissions import Grants
from ...trie import TopicTrie
from .peers import Peer

Member = tuple[str, Peer]  # (queue group, peer)
GroupPlan = tuple[str, bytes, tuple[Member, ...]]  # (queue group, its name encoded, its members matching a topic)
Chosen = tuple[bytes, Peer]  # (queue group encoded, the member chosen)
PLANS_KEPT = 4096  # topics whose matching groups are kept


_NONE: frozenset[Peer] = frozenset()


def _always(routing_id: bytes) -> bool:
    return True


class HandedBack:
    """A group copy another broker handed back (none of its members could take it): the routes
    that could not place it are passed over, and so is every own member that connected with
    ``ECHO 0`` under the publisher's identity (the copy no longer says which peer published it).
    ``tried``: the TRIED value a route chosen now gets with its copy (the brokers that refused)."""

    __slots__ = ("refused", "sender", "tried")

    def __init__(self, refused: Container[Peer], sender: bytes, tried: bytes) -> None:
        self.refused = refused
        self.sender = sender
        self.tried = tried

    def passes_over(self, peer: Peer) -> bool:
        return peer in self.refused if peer.route else not peer.echo and peer.sender == self.sender


def _may_take(
    peer: Peer,
    tokens: tuple[str, ...],
    skip: Peer | None,
    admits: Callable[[Grants], bool] | None,
    only: str | None,
    back: HandedBack | None,
) -> bool:
    """``peer`` (a member of a group matching ``tokens``) may be handed the message (see ``chosen``)."""
    if peer is skip or (peer.grants.deny_subscribe and not peer.grants.delivers(tokens)):
        return False
    if only is not None and (back.passes_over(peer) if back is not None else peer.route):
        return False
    return admits is None or admits(peer.grants)


class GroupChoice:
    def __init__(self, groups: TopicTrie[Member], *, can_take: Callable[[bytes], bool] | None = None) -> None:
        """``can_take(routing_id)``: False while a peer's outgoing queue is backing up (its member is
        passed over while another can take the message; the shell's backlog figure; None: always)."""
        self.groups = groups  # PubSub's: the members of every group, by pattern
        self._chosen_at: dict[Member, int] = {}  # the turn a member was last chosen (least recent first)
        self._turn = 0
        # A topic's matching groups, each with its members (valid while PubSub's version is ``_plans_version``).
        self._plans: dict[tuple[str, ...], tuple[GroupPlan, ...]] = {}
        self._plans_version = -1
        # (topic, group) -> the routes that handed a copy of it back (no member there may take it):
        # passed over while another member may take it; kept as long as the plans are.
        self._refusals: dict[tuple[tuple[str, ...], str], frozenset[Peer]] = {}
        self.can_take: Callable[[bytes], bool] = can_take if can_take is not None else _always

    def forget(self, member: Member) -> None:
        """``member`` left its group (it starts as never chosen if it joins again)."""
        self._chosen_at.pop(member, None)

    def _plan(self, version: int, tokens: tuple[str, ...]) -> tuple[GroupPlan, ...]:
        """The groups matching ``tokens``, each with its members in match order: grouped once
        per topic and kept until a subscription changes (``version``), not per message."""
        if self._plans_version != version:
            self._plans.clear()
            self._refusals.clear()
            self._plans_version = version
        plan = self._plans.get(tokens)
        if plan is None:
            members: dict[str, list[Member]] = {}
            for member in self.groups.match(tokens):
                held = members.get(member[0])
                if held is None:
                    members[member[0]] = [member]
                else:
                    held.append(member)
            plan = tuple((group, group.encode(), tuple(held)) for group, held in members.items())
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
                self._refusals.clear()
            self._plans[tokens] = plan
        return plan

    def chosen(
        self,
        version: int,
        tokens: tuple[str, ...],
        skip: Peer | None,
        admits: Callable[[Grants], bool] | None = None,
        only: str | None = None,
        back: HandedBack | None = None,
    ) -> list[Chosen]:
        """One member per queue group matching ``tokens`` (``version``: PubSub's, for the plans
        kept): the least recently chosen that ``can_take`` (else the least recently chosen of
        all); ``skip`` is never chosen, nor a member whose deny list hides the topic or whose
        grants ``admits`` refuses.  ``only``: the copy of group ``only`` that another broker
        chose this one for: one of this broker's own members of it; with ``back``, the copy this
        broker chose and another handed back: an own member or a route ``back`` does not pass over."""
        plans = self._plan(version, tokens)
        if not plans:
            return []
        chosen_at = self._chosen_at
        chosen: list[Chosen] = []
        anyone = skip is None and admits is None and only is None  # (the usual case: only deny lists can refuse)
        refusals = self._refusals
        for group, group_b, members in plans:
            if only is not None and group != only:
                continue
            refused = refusals.get((tokens, group), _NONE) if refusals else _NONE
            pick: Member | None = None
            pick_at = 0
            if refused:
                pick = self._around(tokens, members, skip, admits, only, back, refused)
            else:
                for member in members:
                    if not (anyone and not member[1].grants.deny_subscribe) and not _may_take(
                        member[1], tokens, skip, admits, only, back
                    ):
                        continue
                    at = chosen_at.get(member, 0)
                    if pick is None or at < pick_at:  # (ties: never chosen; the first in match order)
                        pick, pick_at = member, at
            if pick is None:
                continue
            if len(members) > 1 and not self.can_take(pick[1].routing_id):
                pick = self._least_busy(tokens, members, skip, admits, only, back, pick, refused)
            self._turn += 1
            chosen_at[pick] = self._turn
            chosen.append((group_b, pick[1]))
        return chosen

    def _least_busy(
        self,
        tokens: tuple[str, ...],
        members: tuple[Member, ...],
        skip: Peer | None,
        admits: Callable[[Grants], bool] | None,
        only: str | None,
        back: HandedBack | None,
        backed_up: Member,
        refused: frozenset[Peer],
    ) -> Member:
        """The least recently chosen of ``members`` that ``can_take``, else ``backed_up`` (the least
        recently chosen of all, which cannot); never a route that ``refused`` the topic."""
        chosen_at = self._chosen_at
        can_take = self.can_take
        pick: Member | None = None
        pick_at = 0
        for member in members:
            if (
                member is backed_up
                or member[1] in refused
                or not _may_take(member[1], tokens, skip, admits, only, back)
            ):
                continue
            at = chosen_at.get(member, 0)
            if (pick is None or at < pick_at) and can_take(member[1].routing_id):
                pick, pick_at = member, at
        return backed_up if pick is None else pick

    def _around(
        self,
        tokens: tuple[str, ...],
        members: tuple[Member, ...],
        skip: Peer | None,
        admits: Callable[[Grants], bool] | None,
        only: str | None,
        back: HandedBack | None,
        refused: frozenset[Peer],
    ) -> Member | None:
        """The least recently chosen member that may take the message, passing over the routes that
        ``refused`` this topic while another may (a route's refusal is a hint: its members' grants
        may have changed since, so it is still tried when nobody else may)."""
        chosen_at = self._chosen_at
        best: dict[bool, tuple[int, Member]] = {}  # refused? -> (turn, the least recently chosen)
        for member in members:
            if not _may_take(member[1], tokens, skip, admits, only, back):
                continue
            key = member[1] in refused
            at = chosen_at.get(member, 0)
            held = best.get(key)
            if held is None or at < held[0]:
                best[key] = (at, member)
        found = best.get(False) or best.get(True)
        return found[1] if found is not None else None

    def handed_back(self, version: int, tokens: tuple[str, ...], group: str, route: Peer) -> None:
        """``route`` handed back a copy of ``tokens`` for ``group``: none of its members may take it
        (``version``: PubSub's: the hint lasts as long as the topic's plan, until a subscription changes)."""
        self._plan(version, tokens)  # (clears stale plans and refusals)
        key = (tokens, group)
        self._refusals[key] = self._refusals.get(key, _NONE) | {route}
