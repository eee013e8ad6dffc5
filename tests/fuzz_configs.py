"""Hypothesis strategies for config files: TOML text built from the loader's own tables and keys,
with values of every TOML type (and the nasty ones: NUL, symlink loops, deep nesting, huge
numbers), plus text that is not TOML at all.  Used by tests/test_fuzz.py (load and SIGHUP)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from hypothesis import strategies as st

from mc0.permissions import ACTIONS
from mc0.protocol import Limits
from mc0.settings import BrokerConfig, ClientConfig, HttpConfig, JournalSettings, MemodbConfig, SecurityConfig

TABLES: dict[str, tuple[str, ...]] = {
    "broker": tuple(f.name for f in dataclasses.fields(BrokerConfig)),
    "broker.limits": tuple(f.name for f in dataclasses.fields(Limits)),
    "client": tuple(f.name for f in dataclasses.fields(ClientConfig)),
    "security": tuple(f.name for f in dataclasses.fields(SecurityConfig)),
    "http": tuple(f.name for f in dataclasses.fields(HttpConfig)),
    "memodb": tuple(f.name for f in dataclasses.fields(MemodbConfig)),
    "journals.main": tuple(f.name for f in dataclasses.fields(JournalSettings)),
    "permissions.default": (*ACTIONS, "deny"),
    "permissions.identity.alice": (*ACTIONS, "deny"),
}
NASTY_STRINGS = ("", "a\x00b", "loop/x", "loop", "..", "/", "tcp://127.0.0.1:*", ">", "a.*", "é" * 40, " ", "\n")


def toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # (its escapes are TOML's basic-string escapes)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-2, max_value=70_000),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NASTY_STRINGS),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def config_texts(draw: st.DrawFn, *, permissions: bool = True) -> str:
    """One config file's text: mostly tables and keys the loader knows, some it does not."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.text(max_size=200))  # not TOML, most likely
    if kind == 1:
        depth = draw(st.integers(1, 3000))
        return f"{draw(st.sampled_from(['x', 'data_dir']))} = " + "[" * depth + "]" * depth + "\n"
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(f"data_dir = {toml_value(draw(st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=8))))}")
    names = [t for t in TABLES if permissions or not t.startswith("permissions")]
    for table in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        lines.append(f"[{table}]")
        known = TABLES[table]
        for key in draw(st.lists(st.one_of(st.sampled_from(known), st.text(max_size=6)), max_size=5, unique=True)):
            lines.append(f"{toml_key(key)} = {toml_value(draw(values))}")
    return "\n".join(lines) + "\n"
