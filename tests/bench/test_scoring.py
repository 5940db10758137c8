"""Scores of `cake bench quality` on hand-checked strings (NeedleBench Levenshtein rule, SQuAD F1)."""

from __future__ import annotations

import pytest

from cake_cli.bench.scoring import (
    NEEDLE_WEIGHTS,
    TASK_WEIGHTS,
    f1_score,
    levenshtein_similarity,
    multi_needle_score,
    needle_score,
    normalize_answer,
    qa_f1,
    score_answer,
    weighted_overall,
)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("kitten", "sitting", 1 - 3 / 7),  # 3 edits, longer string 7
        ("flaw", "lawn", 1 - 2 / 4),
        ("abc", "abc", 1.0),
        ("abc", "", 0.0),
        ("", "", 1.0),
    ],
)
def test_levenshtein_similarity(a, b, expected):
    assert levenshtein_similarity(a, b) == pytest.approx(expected)


def test_needle_score_keyword_present_is_full_marks():
    ref = "The secret passcode of the Kelenholt vault is 50256."
    assert needle_score("It is 50256, I think.", ref, "50256") == 1.0
    assert needle_score("A GOLDEN Sextant.", "x", "golden sextant") == 1.0  # case-insensitive


def test_needle_score_partial_credit_is_a_fifth_of_the_similarity():
    # keyword missing: 0.2 x similarity of whitespace-free strings: "abcd" vs "abxd" = 1 - 1/4
    assert needle_score("ab cd", "ab xd", "zz") == pytest.approx(0.2 * 0.75)
    assert needle_score("", "anything", "zz") == 0.0
    ref = "The secret passcode of the Kelenholt vault is 50256."
    near = needle_score("The secret passcode of the Kelenholt vault is 50.", ref, "50256")
    assert 0.18 < near < 0.2  # close to the sentence, but the code is wrong: at most 0.2


def test_multi_needle_score_is_the_mean_over_needles():
    # "111 333" has both 111 and 333; for 222: "111333" vs "222" share no character -> 6 edits / 6 -> 0
    assert multi_needle_score("111 333", ["111", "222", "333"], ["111", "222", "333"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        multi_needle_score("x", ["a", "b"], ["a"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel-Tower!", "eiffeltower"),  # SQuAD drops punctuation without a space
        ("A cat, an owl and THE dog.", "cat owl and dog"),
        ("  ", ""),
        # a point or colon between digits is part of the number; an all-zero fraction is not
        ("sigma is 1.0.", "sigma is 1"),
        ("It is 1.", "it is 1"),
        ("12.5 MiB, 3:1 majority", "12.5 mib 3:1 majority"),
        ("Debian 2.1 and 1.2.0, 48.00", "debian 2.1 and 1.2.0 48"),
        ("version 2.10: end.", "version 2.10 end"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_f1_hand_checked():
    # "cat sat on mat" vs "cat on mat": 3 common tokens, P = 3/4, R = 1
    assert f1_score("the cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    assert f1_score("Paris", "paris.") == 1.0
    assert f1_score("", "Paris") == 0.0
    assert f1_score("the", "a") == 1.0  # both empty after normalisation
    assert f1_score("London", "Paris") == 0.0
    # repeated tokens count once per occurrence in both (multiset intersection)
    assert f1_score("new new york", "new york") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_qa_f1_takes_the_best_gold_answer():
    # "it is malnutrition" vs "malnutrition": P = 1/3, R = 1 -> F1 = 0.5; "poverty" scores 0
    assert qa_f1("It is malnutrition.", ["poverty", "malnutrition"]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        qa_f1("x", [])


def test_score_answer_dispatches_by_task():
    assert score_answer("qa", "Paris", ["Paris"], ()) == 1.0
    assert score_answer("s-rt", "code 123", ["The code is 123."], ["123"]) == 1.0


def test_weights_follow_needlebench_and_renormalise():
    assert sum(TASK_WEIGHTS.values()) == pytest.approx(1.0)
    needle = {t: TASK_WEIGHTS[t] for t in NEEDLE_WEIGHTS}
    assert needle["s-rt"] / needle["m-rt"] == pytest.approx(NEEDLE_WEIGHTS["s-rt"] / NEEDLE_WEIGHTS["m-rt"])
    assert weighted_overall({"s-rt": 1.0, "qa": 0.0}) == pytest.approx(0.3 / 0.55)
    assert weighted_overall({"s-rt": 0.5, "m-rt": 0.5, "m-rs": 0.5, "qa": 0.5}) == pytest.approx(0.5)
    assert weighted_overall({"s-rt": 1.0, "m-rt": 0.0, "m-rs": 0.0}, NEEDLE_WEIGHTS) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        weighted_overall({"other": 1.0})


def test_exact_answer_needs_the_whole_fact():
    from cake_cli.bench.scoring import exact_answer

    ref = ("The secret passcode of the Barowick vault is 12345.",)
    assert exact_answer("s-rt", "The passcode is 12345.", ref, ("12345",)) == 1.0
    assert exact_answer("s-rt", "The secret passcode of the Barowick vault is 1234.", ref, ("12345",)) == 0.0
    assert score_answer("s-rt", "The secret passcode of the Barowick vault is 1234.", ref, ("12345",)) > 0.15
    assert exact_answer("m-rt", "12345, 222 and 333", ref * 3, ("12345", "222", "333")) == 1.0
    assert exact_answer("m-rt", "12345 and 222", ref * 3, ("12345", "222", "333")) == 0.0
    assert exact_answer("qa", "It was Denver Broncos.", ("Denver Broncos", "Broncos"), ()) == 1.0
    assert exact_answer("qa", "Broncosville", ("Broncos",), ()) == 0.0  # whole words only
    # numbers are read as numbers, not as SQuAD's digit strings ("1.0" is not "10", "12.5" not "125")
    assert exact_answer("qa", "The default sigma is 1.", ("1.0",), ()) == 1.0
    assert exact_answer("qa", "The default sigma is 10.", ("1.0",), ()) == 0.0
    assert exact_answer("qa", "Answer: 125", ("12.5",), ()) == 0.0
    assert exact_answer("qa", "Debian 2.1 Slink", ("Debian 2.1",), ()) == 1.0
    assert exact_answer("qa", "Debian 2.12", ("Debian 2.1",), ()) == 0.0
    with pytest.raises(ValueError):
        exact_answer("qa", "x", (), ())
