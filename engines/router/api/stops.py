"""Stop strings matched in time linear in the generated text, whatever the strings are.

The text of a choice grows a few characters per token. Searching the whole text (or even a
window of the longest stop's length) at every token, and testing each prefix of each stop
against the end of the text to know how much to hold back, costs the stop strings' lengths
(or their squares) per token. An Aho-Corasick automaton over the request's stop strings
instead reads each generated character once: its state is the longest end of the text that
begins some stop string, which is both what must be held back and how a match is found, and
each character costs O(1) amortized (every failure link followed was paid for by a character
read before). The automaton is built once per request (:class:`StopSet`) and shared by its
choices; each choice keeps one integer of state (:class:`StopMatcher`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class StopSet:
    """The automaton of one request's stop strings (non-empty strings; see the API's caps).

    Node 0 is the root; ``depth[v]`` is the length of the text node ``v`` spells, ``fail[v]``
    the node of its longest proper suffix that is also a trie node, and ``match[v]`` the
    length of the longest stop string that ends the text of ``v`` (0: none)."""

    stops: tuple[str, ...]
    goto: list[dict[str, int]] = field(default_factory=lambda: [{}])
    fail: list[int] = field(default_factory=lambda: [0])
    depth: list[int] = field(default_factory=lambda: [0])
    match: list[int] = field(default_factory=lambda: [0])

    def __post_init__(self) -> None:
        for s in self.stops:
            v = 0
            for ch in s:
                nxt = self.goto[v].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto.append({})
                    self.fail.append(0)
                    self.depth.append(self.depth[v] + 1)
                    self.match.append(0)
                    self.goto[v][ch] = nxt
                v = nxt
            self.match[v] = len(s)
        queue = deque(self.goto[0].values())  # breadth first: a node's fail is shallower
        while queue:
            v = queue.popleft()
            self.match[v] = self.match[v] or self.match[self.fail[v]]
            for ch, u in self.goto[v].items():
                f = self.fail[v]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[u] = self.goto[f].get(ch, 0)  # shallower than u: never u itself
                queue.append(u)


@dataclass(slots=True)
class StopMatcher:
    """One choice's position in a :class:`StopSet`: feed it the text as it is generated."""

    stops: StopSet
    state: int = 0
    steps: int = 0  # automaton transitions taken: at most twice the characters fed

    @property
    def held(self) -> int:
        """Characters at the end of the text fed so far that may begin a stop string."""
        return self.stops.depth[self.state]

    def feed(self, text: str) -> int | None:
        """Read ``text`` (the next generated characters). Returns where, in ``text``, the
        earliest-starting stop string that ends in it starts (negative: it starts that many
        characters before ``text``), or None when none ends in it."""
        goto, fail, match = self.stops.goto, self.stops.fail, self.stops.match
        v, steps, best = self.state, 0, None
        for i, ch in enumerate(text):
            while v and ch not in goto[v]:
                v = fail[v]
                steps += 1
            v = goto[v].get(ch, 0)
            steps += 1
            if match[v]:
                start = i + 1 - match[v]  # the longest stop ending here starts earliest
                best = start if best is None else min(best, start)
        self.state, self.steps = v, self.steps + steps
        return best
