"""Where the question starts in a rendered prompt: how many of the prompt's last tokens are the
question and what follows it (the chat template's closing), for `CakeConfig.score_rows`.

A task template ends its user text with the question (templates/qa.yaml: "... Question: {question}"),
so the prompt's last tokens are the question's, then the chat template's few closing tokens. CAKE's
observation window (the last w prompt tokens) also holds fixed instruction tokens before the question
when the question is shorter than w; scoring with only the rows from the question on
(`cake-qwin`, docs/method.md) reads the attention of the question's own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def question_rows(tokenizer, input_ids: Sequence[int], question: str) -> int:
    """The number of prompt tokens from the first token of the LAST occurrence of `question` in the
    rendered prompt to the prompt's end.

    The token that holds the question's first character counts (with a byte-level tokenizer it may
    also hold the space before it). Found by decoding ever longer suffixes of the prompt (special
    tokens included) until one holds the whole question, so the tokens need not be re-tokenised and
    any tokenizer that decodes works.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with `decode(ids, skip_special_tokens=...)`).
        input_ids: [n] the prompt's token ids, as the model reads them.
        question: the question text as the template rendered it (surrounding whitespace ignored).

    Returns:
        r, 1 <= r <= n.

    Raises:
        ValueError: an empty question, or one the decoded prompt does not contain.
    """
    ids = list(input_ids)
    text = question.strip()
    if not text:
        raise ValueError("the question is empty")

    def suffix(i: int) -> str:
        return tokenizer.decode(ids[i:], skip_special_tokens=False)

    if text not in suffix(0):
        raise ValueError(f"the question {text[:60]!r} is not in the prompt")
    for i in range(len(ids) - 1, -1, -1):  # the last occurrence is near the end: few, short decodes
        if text in suffix(i):
            return len(ids) - i
    raise ValueError(f"the question {text[:60]!r} is not in the prompt")  # unreachable: suffix(0) holds it
