"""The workload generator: the same seed gives the same requests, and the requests have the
statistics the config states (mix, lengths, Zipf popularity, arrival rate, resent history)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter

import numpy as np
import pytest

from engines.workload import Request, WorkloadConfig, generate, reuse_bound, zipf_weights

CFG = WorkloadConfig(seed=3, sessions=3000, vocab=500).scaled(1 / 16, max_prompt=4096)


@pytest.fixture(scope="module")
def reqs() -> list:
    return generate(CFG)


def test_same_seed_same_requests_and_salt_changes_only_tokens(reqs: list) -> None:
    small = WorkloadConfig(seed=5, sessions=40, vocab=500).scaled(1 / 16)
    a, b = generate(small), generate(small)
    assert a == b
    other = generate(WorkloadConfig(seed=6, sessions=40, vocab=500).scaled(1 / 16))
    assert [r.prompt for r in other] != [r.prompt for r in a]
    salted = generate(WorkloadConfig(seed=5, salt=1, sessions=40, vocab=500).scaled(1 / 16))
    assert [(r.at, r.kind, len(r.prompt), r.max_tokens) for r in salted] == \
        [(r.at, r.kind, len(r.prompt), r.max_tokens) for r in a]
    assert not {tuple(r.prompt[:8]) for r in salted} & {tuple(r.prompt[:8]) for r in a}


def test_mix_and_arrivals(reqs: list) -> None:
    firsts = [r for r in reqs if r.turn == 0]
    kinds = Counter(r.kind for r in firsts)
    assert len(firsts) == CFG.sessions
    assert kinds["chat"] / CFG.sessions == pytest.approx(CFG.chat_share, abs=0.03)
    assert kinds["rag"] / CFG.sessions == pytest.approx(CFG.rag_share, abs=0.03)
    starts = sorted(r.at for r in firsts)
    assert CFG.sessions / starts[-1] == pytest.approx(CFG.session_rate, rel=0.1)
    gaps = np.diff(starts)
    # Gamma with shape k: coefficient of variation 1/sqrt(k) (bursty for k < 1)
    assert gaps.std() / gaps.mean() == pytest.approx(CFG.burstiness ** -0.5, rel=0.15)
    assert [r.at for r in reqs] == sorted(r.at for r in reqs)
    assert [r.index for r in reqs] == list(range(len(reqs)))


def test_lengths_have_their_means(reqs: list) -> None:
    chats = [r for r in reqs if r.kind == "chat"]
    assert statistics.mean(r.max_tokens for r in chats) == pytest.approx(
        CFG.chat_output_len, rel=0.1)
    others = [r.max_tokens for r in reqs if r.kind != "chat"]
    assert statistics.mean(others) == pytest.approx(CFG.output_len, rel=0.1)
    oneoff = [len(r.prompt) for r in reqs if r.kind == "oneoff"]
    assert statistics.mean(oneoff) == pytest.approx(CFG.oneoff_len, rel=0.1)
    first_msgs = [len(r.prompt) for r in chats if r.turn == 0]
    system_mean = statistics.mean(len(r.prompt) for r in chats if r.turn == 0) - CFG.user_len
    assert system_mean == pytest.approx(CFG.system_len, rel=0.1)
    assert max(first_msgs) <= CFG.max_prompt
    turns = Counter(r.session for r in chats)
    assert statistics.mean(turns.values()) == pytest.approx(CFG.turns_mean, rel=0.15)


def test_chat_turns_resend_history_and_follow_each_other(reqs: list) -> None:
    by_index = {r.index: r for r in reqs}
    follow = [r for r in reqs if r.after is not None]
    assert follow
    for r in follow:
        prev = by_index[r.after]
        assert prev.session == r.session and prev.turn == r.turn - 1 and prev.at <= r.at
        # the previous prompt, its answer, then the new message
        assert r.prompt[:len(prev.prompt)] == prev.prompt
        assert len(r.prompt) > len(prev.prompt) + prev.max_tokens


def test_tenants_share_system_prompts_and_docs_follow_zipf(reqs: list) -> None:
    heads: dict[int, set[tuple[int, ...]]] = {}
    for r in reqs:
        if r.kind != "oneoff" and r.turn == 0:
            heads.setdefault(r.tenant, set()).add(tuple(r.prompt[:CFG.system_len]))
    assert len(heads) == CFG.tenants and all(len(h) == 1 for h in heads.values())
    rag = [r for r in reqs if r.kind == "rag"]
    counts = Counter(r.doc for r in rag)
    want = zipf_weights(CFG.docs, CFG.zipf_s)
    for rank in (0, 1, 3):
        assert counts[rank] / len(rag) == pytest.approx(want[rank], rel=0.25)
    oneoff = [tuple(r.prompt[:16]) for r in reqs if r.kind == "oneoff"]
    assert len(set(oneoff)) == len(oneoff)


def test_scaled_shrinks_outputs_by_their_own_factor() -> None:
    full = WorkloadConfig()
    one = full.scaled(1 / 4)
    assert (one.doc_len, one.max_prompt, one.chat_output_len, one.max_output) == \
        (1475, 4096, 84, 512)
    two = full.scaled(1 / 4, 1 / 16, max_prompt=100)
    assert (two.doc_len, two.user_len, two.oneoff_len) == (1475, 40, 500)
    assert (two.chat_output_len, two.output_len, two.max_output) == (21, 11, 128)
    assert two.max_prompt == 100  # changes apply after scaling
    reqs = generate(dataclasses.replace(two, sessions=200, max_prompt=4096))
    assert max(r.max_tokens for r in reqs) <= 128
    assert statistics.mean(r.max_tokens for r in reqs if r.kind == "chat") < 40


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError):
        WorkloadConfig(chat_share=0.8, rag_share=0.3)
    with pytest.raises(ValueError):
        WorkloadConfig(burstiness=0)


def test_reuse_bound_counts_blocks_an_earlier_prompt_began_with() -> None:
    base = dict(index=0, at=0.0, kind="chat", session="s", turn=0, tenant=0, max_tokens=1)
    a = Request(prompt=list(range(10)), **base)  # type: ignore[arg-type]
    b = Request(prompt=list(range(9)) + [50, 51, 52], **base)  # type: ignore[arg-type]
    c = Request(prompt=[1] + list(range(1, 12)), **base)  # type: ignore[arg-type]
    # block 4: b reuses a's first two blocks (8 of its 12 tokens), c nothing
    assert reuse_bound([a, b, c], 4) == pytest.approx(8 / 34)
    assert reuse_bound([a, a], 4) == pytest.approx(8 / 20)  # the last token is computed
    assert 0.3 < reuse_bound(generate(CFG), 16) < 0.9
