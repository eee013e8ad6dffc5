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
nobody is.  The subscriptions themselves (the trie of members) are
PubSub's.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from ...permissions import Grants
from ...trie import TopicTrie
from .peers import Peer

Member = tuple[str, Peer]  # (queue group, peer)
GroupPlan = tuple[str, bytes, tuple[Member, ...]]  # (queue group, its name encoded, its members matching a topic)
Chosen = tuple[bytes, Peer]  # (queue group encoded, the member chosen)
PLANS_KEPT = 4096  # topics whose matching groups are kept


def _always(routing_id: bytes) -> bool:
    return True


def _may_take(
    peer: Peer,
    tokens: tuple[str, ...],
    skip: Peer | None,
    admits: Callable[[Grants], bool] | None,
    only: str | None,
) -> bool:
    """``peer`` (a member of a group matching ``tokens``) may be handed the message (see ``chosen``)."""
    if peer is skip or (peer.grants.deny_subscribe and not peer.grants.delivers(tokens)):
        return False
    if only is not None and peer.route:
        return False
    return admits is None or admits(peer.grants)


class GroupChoice:
    def __init__(self, groups: TopicTrie[Member]) -> None:
        self.groups = groups  # PubSub's: the members of every group, by pattern
        self._chosen_at: dict[Member, int] = {}  # the turn a member was last chosen (least recent first)
        self._turn = 0
        # A topic's matching groups, each with its members (valid while PubSub's version is ``_plans_version``).
        self._plans: dict[tuple[str, ...], tuple[GroupPlan, ...]] = {}
        self._plans_version = -1
        # False while a peer's outgoing queue is backing up (members are skipped then): BrokerCore's backlog.
        self.can_take: Callable[[bytes], bool] = _always

    def forget(self, member: Member) -> None:
        """``member`` left its group (it starts as never chosen if it joins again)."""
        self._chosen_at.pop(member, None)

    def _plan(self, version: int, tokens: tuple[str, ...]) -> tuple[GroupPlan, ...]:
        """The groups matching ``tokens``, each with its members in match order: grouped once
        per topic and kept until a subscription changes (``version``), not per message."""
        if self._plans_version != version:
            self._plans.clear()
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
            self._plans[tokens] = plan
        return plan

    def chosen(
        self,
        version: int,
        tokens: tuple[str, ...],
        skip: Peer | None,
        admits: Callable[[Grants], bool] | None = None,
        only: str | None = None,
    ) -> list[Chosen]:
        """One member per queue group matching ``tokens`` (``version``: PubSub's, for the plans
        kept): the least recently chosen that ``can_take`` (else the least recently chosen of
        all); ``skip`` is never chosen, nor a member whose deny list hides the topic or whose
        grants ``admits`` refuses.  ``only``: the copy of group ``only`` that another broker
        chose this one for: one of this broker's own members of it."""
        plans = self._plan(version, tokens)
        if not plans:
            return []
        chosen_at = self._chosen_at
        chosen: list[Chosen] = []
        anyone = skip is None and admits is None and only is None  # (the usual case: only deny lists can refuse)
        for group, group_b, members in plans:
            if only is not None and group != only:
                continue
            pick: Member | None = None
            pick_at = 0
            for member in members:
                if not (anyone and not member[1].grants.deny_subscribe) and not _may_take(
                    member[1], tokens, skip, admits, only
                ):
                    continue
                at = chosen_at.get(member, 0)
                if pick is None or at < pick_at:  # (ties: never chosen; the first in match order)
                    pick, pick_at = member, at
            if pick is None:
                continue
            if len(members) > 1 and not self.can_take(pick[1].routing_id):
                pick = self._least_busy(tokens, members, skip, admits, only, pick)
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
        backed_up: Member,
    ) -> Member:
        """The least recently chosen of ``members`` that ``can_take``, else ``backed_up`` (the least
        recently chosen of all, which cannot)."""
        chosen_at = self._chosen_at
        can_take = self.can_take
        pick: Member | None = None
        pick_at = 0
        for member in members:
            if member is backed_up or not _may_take(member[1], tokens, skip, admits, only):
                continue
            at = chosen_at.get(member, 0)
            if (pick is None or at < pick_at) and can_take(member[1].routing_id):
                pick, pick_at = member, at
        return backed_up if pick is None else pick
