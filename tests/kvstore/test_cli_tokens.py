"""The one token-id format of every command (``kvstore hash``, ``kvstore explain``,
``kvstore-engine generate``): a JSON list, or ids separated by commas or whitespace."""

from __future__ import annotations

import pytest

from kvstore.cli_tokens import parse_token_ids


@pytest.mark.parametrize("text", [
    "[5, 6, 7]", " [5,6,7]\n", "5,6,7", "5, 6, 7", "5 6 7", "5\n6\n7\n", "5,6,7,", "\t5 ,6  7",
])
def test_every_way_of_writing_ids_reads_the_same(text: str) -> None:
    assert parse_token_ids(text) == [5, 6, 7]


def test_one_id_is_a_prompt_too() -> None:
    assert parse_token_ids("17") == parse_token_ids("[17]") == [17]


@pytest.mark.parametrize("text,why", [
    ("", "no token ids; expected a JSON list, or ids separated by commas or whitespace"),
    (" , ", "no token ids"),
    ("[]", "no token ids"),
    ("[1, 2", "not valid JSON"),
    ('{"tokens": [1]}', "got a JSON object"),
    ("[1, true]", "item 1 is true"),
    ("[1, 2.0]", "item 1 is 2.0"),
    ('["1"]', 'item 0 is "1"'),
    ("1,-2", "item 1 is -2"),
    ("1 2 x", "item 2 is x"),
    ("1 \u00b2", "item 1 is \u00b2"),  # a digit to str.isdigit, not to int()
])
def test_what_is_not_ids_is_named(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_token_ids(text)
