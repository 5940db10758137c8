"""Answer scores of `cake bench quality`: NeedleBench's Levenshtein rule and SQuAD's token F1.

Needle tasks (S-RT, M-RT, M-RS) follow NeedleBench v1 (Li et al. 2024, arXiv 2407.11963, as
implemented by OpenCompass's `NeedleBenchOriginEvaluator`): a prediction that contains the
needle's keyword scores 1; otherwise it scores 0.2 x the Levenshtein similarity between the
prediction and the reference sentence, both with all whitespace removed. Levenshtein similarity
is `rapidfuzz.distance.Levenshtein.normalized_similarity`, i.e. 1 - distance / max(len(a), len(b))
(unit costs; 1.0 for two empty strings). One deviation, documented: the keyword test ignores
case (OpenCompass's single-needle rule is case-sensitive, its multi-needle rule is not).
A multi-needle answer scores the mean of the rule over its needles.

The QA task (SQuAD / HotpotQA, LongBench-like) scores the token F1 of the normalised prediction
against each gold answer (lower case, punctuation and articles a/an/the removed, whitespace
collapsed: the official SQuAD v1.1 `normalize_answer`), taking the best gold answer. One deviation,
documented: a decimal point or colon between two digits is kept and a number's all-zero fraction
dropped ("1.0" and "1." both read "1", "12.5" stays "12.5", "3:1" stays "3:1"), because SQuAD's rule
reads "1.0" as "10" and "12.5" as "125", and so scores "10" right and "1" wrong against the gold "1.0".

The real-document suite (`--suite real`, `bench.real_docs`) reads each reply apart into its short
answer, its cited passage and whether it abstained (`tasks.answers.cite`). A question whose answer
the model read scores the F1 (and exact rule) of the short answer against its gold answers, 0
when the model abstained; a question it should abstain on (not in the document, or in the part
the middle cut left out) scores 1 for an abstention and 0 for any answer (abstention accuracy).

All scores are fractions in [0, 1]; reports multiply by 100.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from rapidfuzz.distance import Levenshtein

PARTIAL_WEIGHT = 0.2  # NeedleBench: weight of the Levenshtein similarity when the keyword is missing

# Weighted average over tasks (fractions summing to 1). NeedleBench's overall score weights
# S-RT 0.4, M-RS 0.3, M-RT 0.3 (OpenCompass `needlebench` summarizer); we keep those ratios for
# the three needle tasks and give the QA task a quarter of the total: 0.75 x (0.4, 0.3, 0.3) + 0.25.
NEEDLE_WEIGHTS: dict[str, float] = {"s-rt": 0.4, "m-rt": 0.3, "m-rs": 0.3}
TASK_WEIGHTS: dict[str, float] = {"s-rt": 0.3, "m-rt": 0.225, "m-rs": 0.225, "qa": 0.25}
# The multi-genre suite (`bench.genre_cases`): its five tasks weigh the same.
GENRE_WEIGHTS: dict[str, float] = {"s-rt": 0.2, "m-rt": 0.2, "m-each": 0.2, "m-rs": 0.2, "qa": 0.2}

# The real-document suite's row tasks: the answer is in the prompt ("real"), it is not in the
# document ("real-absent"), it is in the part the middle cut left out ("real-cut": abstain), or
# in the part the middle cut would leave out, read with --long sections ("real-middle": answer).
# Overall (renormalised over the tasks present): with the middle cut, half answers and half
# abstentions, so a model that always abstains scores at most 50.
REAL_WEIGHTS: dict[str, float] = {"real": 0.5, "real-middle": 0.25, "real-absent": 0.25, "real-cut": 0.25}
ABSTAIN_TASKS = ("real-absent", "real-cut")

_WS = re.compile(r"\s+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_NUMBER_MARKS = ".:"  # kept between two digits: a decimal point, a ratio or a time
_ZERO_FRACTION = re.compile(r"^(\d+)\.0+$")  # "48.0", "1.00": the same number as "48", "1"


def levenshtein_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / max(len(a), len(b)), in [0, 1] (1.0 when both are empty)."""
    return float(Levenshtein.normalized_similarity(a, b))


def needle_score(prediction: str, reference: str, keyword: str) -> float:
    """NeedleBench's score of one answer to one needle, in [0, 1].

    Args:
        prediction: the model's answer text.
        reference: the needle sentence (what a perfect answer restates).
        keyword: the fact the answer must contain (a code, a name).

    Returns:
        1.0 if `keyword` occurs in `prediction` (case-insensitive), else
        0.2 x levenshtein_similarity(prediction, reference) with whitespace removed from both.
    """
    if keyword and keyword.lower() in prediction.lower():
        return 1.0
    return PARTIAL_WEIGHT * levenshtein_similarity(_WS.sub("", prediction), _WS.sub("", reference))


def multi_needle_score(prediction: str, references: Sequence[str], keywords: Sequence[str]) -> float:
    """Mean of `needle_score` over the needles (one reference sentence and keyword each).

    Raises:
        ValueError: no needles, or references and keywords of different lengths.
    """
    if not references or len(references) != len(keywords):
        raise ValueError(f"need one keyword per reference (got {len(references)} and {len(keywords)})")
    return sum(needle_score(prediction, r, k) for r, k in zip(references, keywords)) / len(references)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, drop punctuation and articles, collapse whitespace; except
    that a "." or ":" between two digits stays and a number's all-zero fraction goes ("1.0" -> "1",
    "12.5" stays, "1.2.0" stays: only a whole token of digits, a point and zeros loses them)."""
    text = text.lower()
    kept = "".join(
        ch
        for i, ch in enumerate(text)
        if ch not in _PUNCT
        or (ch in _NUMBER_MARKS and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit())
    )
    return " ".join(_ZERO_FRACTION.sub(r"\1", token) for token in _ARTICLES.sub(" ", kept).split())


def f1_score(prediction: str, answer: str) -> float:
    """Token-level F1 of the normalised prediction against one normalised answer, in [0, 1].

    Two empty normalised strings score 1; one empty string scores 0.
    """
    pred, gold = normalize_answer(prediction).split(), normalize_answer(answer).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, answers: Iterable[str]) -> float:
    """Best token F1 over the gold answers (SQuAD's max over references).

    Raises:
        ValueError: no gold answer.
    """
    scores = [f1_score(prediction, a) for a in answers]
    if not scores:
        raise ValueError("a QA case needs at least one gold answer")
    return max(scores)


def score_answer(task: str, prediction: str, references: Sequence[str], keywords: Sequence[str]) -> float:
    """The score of one answer by its task's rule: F1 for "qa", NeedleBench's rule otherwise."""
    if task == "qa":
        return qa_f1(prediction, references)
    return multi_needle_score(prediction, references, keywords)


def exact_answer(task: str, prediction: str, references: Sequence[str], keywords: Sequence[str]) -> float:
    """1.0 when the answer holds the whole fact, else 0.0: every needle keyword (case-insensitive)
    for the needle tasks; a gold answer's normalised text inside the normalised prediction for "qa".

    NeedleBench's score gives a wrong answer partial credit (0.2 x Levenshtein) for restating the
    question, and the first answer token comes from the full prefill, so a method that evicted the
    needle still starts its answer right: this strict rule tells kept facts from lucky starts.

    Raises:
        ValueError: a QA case without gold answers, or a needle case without keywords.
    """
    if task == "qa":
        if not references:
            raise ValueError("a QA case needs at least one gold answer")
        pred = f" {normalize_answer(prediction)} "
        return float(any(f" {normalize_answer(a)} " in pred for a in references if normalize_answer(a)))
    if not keywords:
        raise ValueError("a needle case needs its keywords")
    return float(all(k.lower() in prediction.lower() for k in keywords))


def real_scores(answer: str, abstained: bool, answers: Sequence[str]) -> tuple[float, float]:
    """(score, exact) of one cited reply on the real-document suite.

    Args:
        answer: the reply's short answer (without its passage; `tasks.answers.cite.parse_cited`).
        abstained: the reply says the document does not hold the answer.
        answers: the gold answers; empty when the model should abstain (the answer is not in the
            document, or not in the part of it the model read).

    Returns:
        Answerable: (F1, exact) against the gold answers, (0, 0) for an abstention. Otherwise the
        abstention's accuracy twice: (1, 1) when it abstained, (0, 0) when it answered.
    """
    if not answers:
        return (1.0, 1.0) if abstained else (0.0, 0.0)
    if abstained or not answer.strip():
        return 0.0, 0.0
    return qa_f1(answer, answers), exact_answer("qa", answer, answers, ())


def weighted_overall(task_scores: Mapping[str, float], weights: Mapping[str, float] = TASK_WEIGHTS) -> float:
    """Weighted mean of per-task scores, the weights renormalised over the tasks present.

    Raises:
        ValueError: no task with a weight is present.
    """
    present = {t: w for t, w in weights.items() if t in task_scores}
    total = sum(present.values())
    if not present or total <= 0:
        raise ValueError(f"no weighted task among {sorted(task_scores)}")
    return sum(task_scores[t] * w for t, w in present.items()) / total
