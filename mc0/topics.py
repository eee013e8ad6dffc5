"""Topic and subscription-pattern rules (NATS subject semantics).

Contract:

* A topic is dot-separated tokens of UTF-8: no empty token, no whitespace.
* A pattern may use ``*`` (exactly one token) and ``>`` (one or more trailing
  tokens, last position only).  They are wildcards only as whole tokens:
  ``a*`` is an ordinary literal token.
* Published topics must be literal (no ``*`` or ``>`` token).
* Topics under ``mc0.sys.`` are the broker's own space: a pattern matches
  them only if it names ``mc0.sys`` literally (``>``, ``*.sys.>`` and
  ``mc0.>`` do not), as NATS keeps ``$SYS`` out of ``>``.
* Size rules (UTF-8 bytes, token count) are checked before anything else, so
  an absurd input (say 10,000 tokens) is rejected in O(length) with no
  recursion.

Protocol 0.x (the seed, as mc0d did it) has no wildcards and no grammar: a
0.x peer's topic, in a PUT or a SUB, is an exact string (non-empty, at most
``max_bytes``).  ``seed_topic`` says how the two meet: a 0.x topic that is
also a 1.0 topic *is* that topic (its tokens: it reaches 1.0 wildcard
subscribers, and a 0.x SUB of it is a literal pattern a 1.0 PUT reaches);
any other (``mcollective discovery``, ``a.*``, ``a..b``) is *opaque* (no
tokens) and matches only the same string from another 0.x peer.

Violations raise :class:`mc0.errors.InvalidTopic`.
"""

from __future__ import annotations

import re

from .errors import InvalidTopic

SEPARATOR = "."
SINGLE = "*"  # matches exactly one token
TAIL = ">"  # matches one or more trailing tokens

SYSTEM_TOKENS = ("mc0", "sys")  # the broker's own topics: matched only by patterns naming them

DEFAULT_MAX_TOPIC_BYTES = 1024
DEFAULT_MAX_TOPIC_TOKENS = 32

_WHITESPACE = re.compile(r"\s")


def _split(text: str, max_bytes: int, max_tokens: int) -> list[str]:
    if not text:
        raise InvalidTopic(text, "empty")
    # Cheap size checks first: character count bounds byte count from below.
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise InvalidTopic(text, f"longer than {max_bytes} UTF-8 bytes", oversize=True)
    if text.count(SEPARATOR) >= max_tokens:
        raise InvalidTopic(text, f"more than {max_tokens} tokens", oversize=True)
    if _WHITESPACE.search(text):
        raise InvalidTopic(text, "contains whitespace")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTopic(text, "not valid UTF-8") from None
    tokens = text.split(SEPARATOR)
    if "" in tokens:
        raise InvalidTopic(text, "empty token")
    return tokens


def split_topic(
    topic: str,
    *,
    max_bytes: int = DEFAULT_MAX_TOPIC_BYTES,
    max_tokens: int = DEFAULT_MAX_TOPIC_TOKENS,
) -> tuple[str, ...]:
    """Validate a literal (publishable) topic and return its tokens."""
    tokens = _split(topic, max_bytes, max_tokens)
    if SINGLE in tokens or TAIL in tokens:
        raise InvalidTopic(topic, "wildcards are not allowed in a published topic")
    return tuple(tokens)


def split_pattern(
    pattern: str,
    *,
    max_bytes: int = DEFAULT_MAX_TOPIC_BYTES,
    max_tokens: int = DEFAULT_MAX_TOPIC_TOKENS,
) -> tuple[str, ...]:
    """Validate a subscription pattern and return its tokens."""
    tokens = _split(pattern, max_bytes, max_tokens)
    if TAIL in tokens[:-1]:
        raise InvalidTopic(pattern, f"{TAIL!r} may only be the last token")
    return tuple(tokens)


def seed_topic(
    topic: str,
    *,
    max_bytes: int = DEFAULT_MAX_TOPIC_BYTES,
    max_tokens: int = DEFAULT_MAX_TOPIC_TOKENS,
) -> tuple[str, ...]:
    """A 0.x peer's topic (PUT or SUB): its 1.0 tokens when it is a 1.0 topic, else ``()`` (opaque:
    matched as an exact string); InvalidTopic when empty or over ``max_bytes``."""
    if not topic:
        raise InvalidTopic(topic, "empty")
    if len(topic) > max_bytes or len(topic.encode("utf-8", "surrogatepass")) > max_bytes:
        raise InvalidTopic(topic, f"longer than {max_bytes} UTF-8 bytes", oversize=True)
    try:
        return split_topic(topic, max_bytes=max_bytes, max_tokens=max_tokens)
    except InvalidTopic:
        return ()


def is_literal(tokens: tuple[str, ...]) -> bool:
    """True when the tokens contain no wildcard."""
    return SINGLE not in tokens and TAIL not in tokens


def is_system(tokens: tuple[str, ...]) -> bool:
    """A topic (or pattern) in the broker's own ``mc0.sys`` space, named literally."""
    return len(tokens) > 2 and tokens[0] == SYSTEM_TOKENS[0] and tokens[1] == SYSTEM_TOKENS[1]


def pattern_matches(pattern: tuple[str, ...], topic: tuple[str, ...]) -> bool:
    """Whether a (validated) pattern matches a (validated) literal topic."""
    if is_system(topic) and pattern[:2] != SYSTEM_TOKENS:
        return False  # wildcards never reach into mc0.sys
    last = len(pattern) - 1
    for i, want in enumerate(pattern):
        if want == TAIL and i == last:
            return len(topic) > i
        if i >= len(topic):
            return False
        if want != SINGLE and want != topic[i]:
            return False
    return len(topic) == len(pattern)


def pattern_covers(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Whether every topic ``inner`` matches is also matched by ``outer``."""
    for i, want in enumerate(outer):
        if want == TAIL:
            return i < len(inner)
        if i >= len(inner):
            return False
        have = inner[i]
        if have == TAIL:
            return False  # inner reaches deeper than outer can
        if want != SINGLE and want != have:
            return False  # a literal covers only the same literal (not '*')
    return len(inner) == len(outer)
