"""Eviction policies and admission rules, by name."""

from __future__ import annotations

from kvstore.policy.base import Admission, Policy
from kvstore.registry import Registry

POLICIES = Registry(
    "eviction policy",
    {
        "lru": "kvstore.policy.lru:LRUPolicy",
        "lfu": "kvstore.policy.lfu:LFUPolicy",
        "s3fifo": "kvstore.policy.s3fifo:S3FIFOPolicy",
    },
)

ADMISSIONS = Registry(
    "admission rule",
    {
        "always": "kvstore.policy.admission:AlwaysAdmit",
        "seen_twice": "kvstore.policy.admission:SeenTwice",
    },
)


def make_policy(name: str) -> Policy:
    policy: Policy = POLICIES.create(name)
    return policy


def make_admission(name: str) -> Admission:
    admission: Admission = ADMISSIONS.create(name)
    return admission


__all__ = ["ADMISSIONS", "POLICIES", "Admission", "Policy", "make_admission", "make_policy"]
