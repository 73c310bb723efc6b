"""Every registered policy builds by name with no arguments and reports that name."""

from __future__ import annotations

import pytest

from kvstore.policy import POLICIES, make_policy
from kvstore.policy.base import Policy


@pytest.mark.parametrize("name", POLICIES.names())
def test_registry_builds_every_policy_without_arguments(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, Policy) and policy.name == name and len(policy) == 0


def test_unknown_policy_lists_known_names() -> None:
    with pytest.raises(ValueError, match="lfu, lru, s3fifo"):
        make_policy("arc")
