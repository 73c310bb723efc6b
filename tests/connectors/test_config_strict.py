"""The connector's extra config is parsed strictly: a wrong value or an unknown key fails with
an error naming the key, never a silent coercion."""

from __future__ import annotations

import pytest

from connectors.vllm.config import ConnectorConfig

URL = {"kvstore_url": "http://127.0.0.1:9"}


@pytest.mark.parametrize("value", ["false", "False", "0", 0, 1, "no", None])
def test_prefetch_must_be_a_real_boolean(value: object) -> None:
    with pytest.raises(ValueError, match="prefetch"):
        ConnectorConfig.from_extra({**URL, "prefetch": value}, env={})


def test_json_booleans_are_taken_as_given() -> None:
    assert ConnectorConfig.from_extra({**URL, "prefetch": False}, env={}).prefetch is False
    assert ConnectorConfig.from_extra({**URL, "prefetch": True}, env={}).prefetch is True
    assert ConnectorConfig.from_extra(URL, env={}).prefetch is True


@pytest.mark.parametrize(("key", "value"), [("timeout_s", "5"), ("lease_s", True),
                                            ("namespace", 7), ("load_mode", ["sync"])])
def test_wrong_types_name_their_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        ConnectorConfig.from_extra({**URL, key: value}, env={})


def test_unknown_key_is_named_and_token_is_never_echoed() -> None:
    with pytest.raises(ValueError, match="prefech") as info:
        ConnectorConfig.from_extra({**URL, "prefech": False, "token": 12345}, env={})
    assert "token" in str(info.value) and "12345" not in str(info.value)
