"""Where `--long sections` loses answers: a real-suite run read in sections against the same questions read whole.

Reads a `cake bench quality --suite real --long sections` results file (its rows keep every section's reply and
support, `sections`) and, optionally, a run of the same questions read whole. For every method and budget it
prints, on the answerable questions both runs hold:
- exact answers read whole, and read in sections by the suite's rule (the first section whose cited passage is
  found in that section answers);
- the same sections with two other ways to pick the answering section: the located answer whose passage and answer
  hold the most of the question's content words (`tasks.answers.locate.content_words`), and an oracle that takes any
  section's located answer that is right (how many answers a better choice of section could win back at most).
Replies are scored as given (`bench.scoring.real_scores`), before any abstention rule withholds one.

    python scripts/real_sections.py SECTIONS.json [--whole WHOLE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cake_cli.bench.real_docs import load_set
from cake_cli.bench.scoring import real_scores
from cake_cli.tasks.answers.cite import LOCATED, UNSUPPORTED, parse_cited
from cake_cli.tasks.answers.locate import content_words, missing_words

ANSWERABLE = ("real", "real-middle")


def first_located(sections: list, question) -> str:
    """The suite's rule: the first located reply, else the first unsupported one, else the first."""
    for status in (LOCATED, UNSUPPORTED):
        hit = next((reply for reply, got in sections if got == status), None)
        if hit is not None:
            return hit
    return sections[0][0]


def most_relevant(sections: list, question) -> str:
    """The located reply whose passage and answer hold the largest share of the question's content words."""
    asked = content_words(question.question)

    def share(reply: str) -> float:
        cited = parse_cited(reply)
        return 1 - len(missing_words(f"{cited.passage} {cited.answer}", asked)) / max(len(asked), 1)

    located = [(share(reply), -i, reply) for i, (reply, got) in enumerate(sections) if got == LOCATED]
    return max(located)[2] if located else first_located(sections, question)


def any_right(sections: list, question) -> str:
    """An oracle: a located reply that is right, if any section gave one."""
    for reply, got in sections:
        cited = parse_cited(reply)
        if got == LOCATED and real_scores(cited.answer, cited.abstained, question.answers)[1]:
            return reply
    return first_located(sections, question)


RULES = {"first located (the suite's)": first_located, "most relevant": most_relevant, "any right (oracle)": any_right}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", type=Path, help="a --long sections results file (rows with `sections`)")
    parser.add_argument("--whole", type=Path, help="a results file of the same questions read whole")
    args = parser.parse_args()
    questions = {q.id: q for doc in load_set().documents for q in doc.questions}
    rows = [r for r in json.loads(args.sections.read_text())["rows"] if r["task"] in ANSWERABLE and r.get("sections")]
    whole = json.loads(args.whole.read_text())["rows"] if args.whole else []
    if whole:
        both = {r["case_id"] for r in whole if r["task"] in ANSWERABLE or r["task"] == "real-cut"}
        rows = [r for r in rows if r["case_id"] in both]
    for cell in sorted({(r["method"], r["budget"]) for r in rows}, key=str):
        mine = [r for r in rows if (r["method"], r["budget"]) == cell]
        ids = {r["case_id"] for r in mine}
        parts = [f"{cell[0]} B={cell[1] or '-'}: {len(mine)} answerable"]
        if whole:
            read = sum(r["exact"] for r in whole if r["case_id"] in ids and (r["method"], r["budget"]) == cell)
            parts.append(f"read whole {read:.0f}")
        for name, rule in RULES.items():
            right = 0.0
            for r in mine:
                question = questions[r["case_id"]]
                cited = parse_cited(rule(r["sections"], question))
                right += real_scores(cited.answer, cited.abstained, question.answers)[1]
            parts.append(f"sections, {name} {right:.0f}")
        print(" | ".join(parts))


if __name__ == "__main__":
    main()
