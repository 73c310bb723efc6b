"""Eviction policies and admission rules, by name."""

from __future__ import annotations

from kvstore.policy.base import Admission, DrawsFromTier, Policy
from kvstore.registry import Registry
from kvstore.tiers.base import IndexedTier, Tier

POLICIES = Registry(
    "eviction policy",
    {
        "lru": "kvstore.policy.lru:LRUPolicy",
        "lfu": "kvstore.policy.lfu:LFUPolicy",
        "s3fifo": "kvstore.policy.s3fifo:S3FIFOPolicy",
        "sampled_lru": "kvstore.policy.sampled:SampledLRU",
        "sampled_lfu": "kvstore.policy.sampled:SampledLFU",
        "sampled_s3fifo": "kvstore.policy.sampled_fifo:SampledS3FIFO",
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


def make_tier_policy(name: str, tier: Tier) -> Policy:
    """The policy ``name`` for ``tier``. A tier that indexes itself (disk: its LMDB file) gets
    the sampled rule that stands in for ``name``, drawing victims from the tier, so that no
    Python object per block is kept for it (:mod:`kvstore.policy.sampled`)."""
    if not isinstance(tier, IndexedTier):
        return make_policy(name)
    from kvstore.policy.sampled import FOR_POLICY

    policy = make_policy(FOR_POLICY[name])
    if not isinstance(policy, DrawsFromTier):
        raise TypeError(f"policy {FOR_POLICY[name]!r} cannot draw victims from a tier")
    policy.attach(tier)
    return policy


def make_admission(name: str) -> Admission:
    admission: Admission = ADMISSIONS.create(name)
    return admission


__all__ = ["ADMISSIONS", "POLICIES", "Admission", "Policy", "make_admission", "make_policy",
           "make_tier_policy"]
