"""mc0.message's builders (frozen_builder, new_message): the same values as the dataclasses' own __init__."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from mc0.message import Message, Reply, Request, frozen_builder, new_message


@pytest.mark.parametrize(
    ("cls", "values"),
    [
        (Reply, ((b"a", b"b"), {"X-A": "1"}, False, "w", None)),
        (Reply, ((), {}, True, None, ValueError("x"))),
        (Request, ("1", "svc", (b"q",), {}, "caller", 12.5)),
        (Message, ("t.a", (b"x",), "s", {}, "j", 3, "g")),
    ],
)
def test_a_built_value_is_the_one_its_constructor_makes(cls: type, values: tuple[Any, ...]) -> None:
    built = frozen_builder(cls)(*values)
    assert type(built) is cls and built == cls(*values)
    if cls is not Reply or values[4] is None:  # (an exception compares by identity once unpickled)
        assert pickle.loads(pickle.dumps(built)) == built
    with pytest.raises(AttributeError):
        built.parts = ()  # still frozen


def test_a_builder_takes_every_field_and_nothing_else() -> None:
    build = frozen_builder(Reply)
    with pytest.raises(TypeError):
        build((b"x",), {}, True, None)  # one short: no defaults
    with pytest.raises(TypeError):
        build((b"x",), {}, True, None, None, "extra")


def test_new_message_is_the_message_its_constructor_makes() -> None:
    assert new_message("t", (b"x",), None, {}, None, None, None) == Message("t", (b"x",))
