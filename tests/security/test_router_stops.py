"""Stop strings are matched in time linear in the generated text: the router's matcher
takes at most two automaton steps per generated character, whatever the stop strings (the
review's case, long stop strings that almost match at every position, cost the old
matcher the square of their length per token), and it stops exactly where searching the
whole text would."""

from __future__ import annotations

import random

from engines.router.api.schemas import MAX_STOP_CHARS, MAX_STOPS
from engines.router.api.stops import StopMatcher, StopSet


def test_matching_costs_at_most_two_steps_per_character() -> None:
    # every stop is "a" * k + "b": the text "aaaa..." keeps each of them one character from
    # matching, which is the worst case for windowed or prefix-by-prefix matching
    stops = tuple("a" * (MAX_STOP_CHARS - 1 - i) + "b" for i in range(MAX_STOPS))
    m = StopMatcher(StopSet(stops))
    fed = 0
    for _ in range(50_000):
        assert m.feed("aaaa") is None
        fed += 4
    assert m.held == MAX_STOP_CHARS - 1  # the longest stop's "a"s are held back
    assert m.steps <= 2 * fed
    assert m.feed("ab") == 1 - (MAX_STOP_CHARS - 1)  # the longest match starts earliest


def test_the_match_is_where_a_search_of_the_whole_text_finds_it() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        stops = tuple("".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
                      for _ in range(rng.randint(1, 4)))
        m = StopMatcher(StopSet(stops))
        text = ""
        for _ in range(12):
            chunk = "".join(rng.choice("abc") for _ in range(rng.randint(0, 4)))
            at = m.feed(chunk)
            searched, text = len(text), text + chunk
            # a search of the whole text for the first stop that ends in the new chunk
            ends = [(text.find(s, max(0, searched - len(s) + 1)), s) for s in stops]
            hits = [i for i, _ in ends if i >= 0]
            if hits:
                assert at == min(hits) - searched, (stops, text)
                break
            assert at is None
            assert m.held == max((k for s in stops for k in range(1, len(s))
                                  if text.endswith(s[:k])), default=0)
