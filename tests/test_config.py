"""The config loader (mc0.config.load): a config that raised anything but ConfigError (deep nesting, NUL
bytes, a path that cannot resolve) is one ConfigError of one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mc0.config import load
from mc0.errors import ConfigError

# (name, config text, where the one-line error points); "loop" is a symlink to itself in the config's folder.
BROKEN_CONFIGS = [
    ("nested-arrays", "x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("nested-inline-tables", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
    ("nested-known-key", "[broker]\nbind = " + "[" * 300 + "]" * 300 + "\n", "broker.bind"),
    ("data-dir-nul", 'data_dir = "a\\u0000b"\n', "data_dir: must not contain a NUL"),
    ("keys-dir-nul", '[security]\nkeys_dir = "k\\u0000"\n', "security.keys_dir: must not contain a NUL"),
    ("bind-nul", '[broker]\nbind = ["tcp://127.0.0.1:1\\u0000"]\n', "broker.bind: must not contain a NUL"),
    ("data-dir-symlink-loop", 'data_dir = "loop/x"\n', "data_dir: cannot resolve"),
]


@pytest.mark.parametrize(("name", "text", "where"), BROKEN_CONFIGS, ids=[c[0] for c in BROKEN_CONFIGS])
def test_a_config_that_raised_anything_but_config_error_is_a_config_error_naming_the_key(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    (tmp_path / "loop").symlink_to("loop")
    path = tmp_path / "mc0.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert where in message and "\n" not in message and len(message) < 400
