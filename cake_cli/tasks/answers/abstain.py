"""When an answer is withheld: `cake qa --abstain doubt|foreign|unsupported|never`.

The model is asked to say "not in the document" when the document does not hold the answer, but a
small model rarely does (Qwen2.5-Coder-0.5B abstained on 1 of 12 such questions and made up the
other 11). Every reply's passage is checked against the document (`tasks.answers.cite`): an
answer that no passage of the document holds is "unsupported". With `--abstain unsupported` such
an answer is withheld: the reply the user gets says the document does not support it, the model's
own answer is kept beside it (the report's location line, `raw_answer` and `support.answer` in the
JSON) and the support stays "unsupported" with `withheld` set. `--abstain foreign` withholds an
unsupported answer only when one of its content words or numbers is nowhere in the document (an
answer made of the document's own words, "RC bugs", "help", is shown, flagged). `--abstain doubt`
(the default) also withholds one where the model's own probability of opening its reply with an
abstention, read on its kept cache (`tasks.answers.check.doubt_answer`), reaches DOUBT_THRESHOLD: a
small model that answers anyway often still puts some of its mass on "not". `--abstain checked`
(the benchmark's only) instead withholds one the model, asked on its kept cache whether the document
states it, gives a probability below CHECK_THRESHOLD. With `never` the answer is shown as the model
gave it, flagged unsupported. Located answers and abstentions are never changed.
"""

from __future__ import annotations

from dataclasses import replace

from cake_cli.tasks.answers.cite import UNSUPPORTED
from cake_cli.tasks.answers.locate import content_words, missing_numbers, missing_words
from cake_cli.tasks.results import Support

NEVER, FOREIGN, WITHHOLD_UNSUPPORTED, CHECKED, DOUBT = "never", "foreign", "unsupported", "checked", "doubt"
ABSTAIN_MODES = (NEVER, FOREIGN, WITHHOLD_UNSUPPORTED, CHECKED, DOUBT)
TASK_ABSTAIN_MODES = (NEVER, FOREIGN, WITHHOLD_UNSUPPORTED, DOUBT)  # `cake qa`'s: `checked` is the benchmark's only
CHECK_THRESHOLD = 0.5  # `checked`: an unsupported answer the model itself gives P(yes) below this is withheld
# `doubt`: an unsupported answer whose abstention probability reaches this is withheld; chosen on the real
# set's tune half (the most right replies, answers and abstentions, benchmarks/real.md)
DOUBT_THRESHOLD = 0.1
DEFAULT_ABSTAIN = DOUBT  # `cake qa`'s and `cake bench quality --suite real`'s default (benchmarks/real.md)
WITHHELD = "not supported by the document"  # the answer shown in place of one no passage supports


def foreign_terms(answer: str, document: str, query: str = "") -> list[str]:
    """The content words (`locate.content_words`, fuzzily for 5+ letters) and numbers of `answer`
    that are nowhere in `document`: what the model brought from outside it. [] when the answer
    uses only the document's (or the question's) words.

    Args:
        answer: the short answer, without its passage.
        document: the text the model read (the whole document, or its section).
        query: the question (its words are not content).
    """
    words = missing_words(document, content_words(answer, query)) if answer else []
    return words + [n for n in missing_numbers(document, answer) if n not in words]


def decide(
    support: Support, mode: str, document: str = "", query: str = "", check: float | None = None,
    threshold: float | None = None,
) -> Support:  # fmt: skip
    """The support of an answer after the abstention rule `mode`.

    Args:
        support: the answer's support as `cite.find_support` found it.
        mode: "never" (keep every answer), "foreign" (withhold an unsupported answer with a word
            or number not in `document`), "checked" (also one whose `check` is below CHECK_THRESHOLD),
            "doubt" (also one whose `check` reaches DOUBT_THRESHOLD) or "unsupported" (withhold every
            unsupported one).
        document: the text the model read ("foreign", "checked", "doubt").
        query: the question ("foreign", "checked", "doubt": its words are not the answer's content).
        check: "checked": the model's P(yes) that the document states the answer
            (`tasks.answers.check.check_answer`); "doubt": its probability of opening the reply with an
            abstention (`tasks.answers.check.doubt_answer`); None: not asked (the rule is then "foreign"'s).
        threshold: "checked" and "doubt": the threshold `check` is set against; None: the mode's own
            (CHECK_THRESHOLD, DOUBT_THRESHOLD). A benchmark sweeps it on the tune half.

    Returns:
        `support`, or when the rule withholds it a copy with `withheld` True (status, answer and
        passage unchanged: the model's answer stays visible).

    Raises:
        ValueError: `mode` is not one of ABSTAIN_MODES.
    """
    if mode not in ABSTAIN_MODES:
        raise ValueError(f"unknown abstention mode {mode!r} (one of {', '.join(ABSTAIN_MODES)})")
    if mode == NEVER or support.status != UNSUPPORTED:
        return support
    if mode in (FOREIGN, CHECKED, DOUBT) and not foreign_terms(support.answer, document, query):
        if mode == FOREIGN or check is None:
            return support
        if mode == CHECKED and check >= (CHECK_THRESHOLD if threshold is None else threshold):
            return support
        if mode == DOUBT and check < (DOUBT_THRESHOLD if threshold is None else threshold):
            return support
    return replace(support, withheld=True)


def shown_answer(support: Support, answer: str) -> str:
    """The answer the user is shown: WITHHELD when the support was withheld, else `answer`."""
    return WITHHELD if support.withheld else answer


def counts_as_abstention(support: Support) -> bool:
    """Whether the reply, as the user gets it, does not answer: the model abstained or the answer
    was withheld (the benchmark scores both as abstentions)."""
    return support.status == "abstained" or support.withheld
