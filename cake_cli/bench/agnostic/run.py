"""`cake bench cache --parts agnostic`: compress once without the questions, then ask many (issue 25's protocol).

Each document is a QA case (SQuAD / HotpotQA gold paragraphs among distractors, `bench.datasets`) with the
three needles of a multi-needle case (`bench.needles`, M-RT) inserted at `depth`, NeedleBench-style. It is
compressed once, with no question known, and then asked 4 questions, each on its own from that one cache:
every needle alone (scored as S-RT) and the QA item's question (F1). All prompts share one prefix (the
`bench_needle` template's chat opening and document block); each question is that template's suffix, run
as a continuation over a copy of the compressed prefix (`engine.continuation`).

Rows (`ROWS`), at each keep ratio r (budget B = round(r · n) tokens per layer on average, n the prefix's
tokens, at least w + 1) and each KV bit width (`engine.kvquant` as the .cake file stores it, held quantized
in memory for answering as a loaded file is, `engine.kvmemory`):

- ``full``: the prefix's whole cache (no eviction; at 16/8/4 bits);
- ``aware``: question-aware CAKE, the reference: the whole prompt (question included) prefilled and evicted
  with the question in the window (a .cake kept whole, `--scoring question`; 16 bits, its file is the full
  prefix's);
- ``reconstruct+cake`` / ``+uniform`` / ``+global``: KVzip's reconstruction scores (`engine.reconstruct`,
  computed once per document) with CAKE's budgets, equal budgets, or KVzip's one ranking over layers and
  KV heads (`engine.headlengths`);
- ``end+snapkv``, ``end+cake``: the window is the document block's last w tokens (`--scoring end`);
- ``instruction+snapkv``: the window is the template's instruction with an empty question (`--scoring
  instruction`).

One full-cache prefill of the prefix is recorded per document (`engine.replay.record`) and serves the full
cache, the end-window rows and the reconstruction; the instruction row records prefix + probe, and each
question's aware row its whole prompt. Every answer is a row of the run file, which is saved after every
document; a rerun with the same settings skips the documents already in it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from safetensors.torch import save as save_tensors

from cake_cli.bench.datasets import make_qa_case, qa_item
from cake_cli.bench.needles import insert_at_depths, needle_facts
from cake_cli.bench.quality.run import PROMPT_SLACK, Model
from cake_cli.bench.scoring import exact_answer, score_answer
from cake_cli.bench.splits import needle_depths
from cake_cli.engine.cachefile import cache_tensors, requantized, value_coding_of
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK, CakeConfig
from cake_cli.engine.continuation import SavedCascade, clone_cache, continue_and_decode, probe_config, without_probe
from cake_cli.engine.generate import Prefilled, decode, sync_device
from cake_cli.engine.methods import with_method
from cake_cli.engine.reconstruct import evict_by_scores, reconstruction_scores
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.saved.compress import REPEAT_INSTRUCTION
from cake_cli.tasks.templates import build_prompt, load_template, render_split, split_at

TEMPLATE = "bench_needle"  # one template, so every question shares the prefix
RECONSTRUCT = ("reconstruct+cake", "reconstruct+uniform", "reconstruct+global")
WINDOWED = ("end+snapkv", "instruction+snapkv", "end+cake")
AGNOSTIC = (*RECONSTRUCT, *WINDOWED)  # the question-agnostic rows
ROWS = ("full", "aware", *AGNOSTIC)
RATIOS = (0.5, 0.25, 0.1, 0.03)
BITS = (16, 8, 4)
_ALLOCATION = {"reconstruct+cake": "cake", "reconstruct+uniform": "uniform", "reconstruct+global": "global"}
_METHOD = {"end+snapkv": "snapkv", "instruction+snapkv": "snapkv", "end+cake": "cake"}


def single_question(needle: str) -> str:
    """The question that asks one M-RT needle alone: "The lucky number of X is 123." -> "What is the lucky
    number of X?"."""
    subject = re.sub(r" is [^ ]+\.$", "", needle)
    return f"What is {subject[0].lower()}{subject[1:]}?"


def agnostic_document(model: Model, split: str, index: int, depth: float, length: int) -> dict:
    """Document `index` at `length` tokens: a QA case with the 3 M-RT needles of the same index inserted from
    `depth` on; its 4 questions (each needle alone, then the QA question) with references and keywords.

    Raises:
        CakeError: the QA data package is missing; ValueError: the length is too short.
    """
    template = load_template(TEMPLATE)
    facts = needle_facts("m-rt", split, index)
    qa = qa_item(split, index, length)
    overhead = len(build_prompt(model.tokenizer, template, "", max_prompt_tokens=10**9, question=qa.question).input_ids)
    needle_tokens = sum(
        len(model.tokenizer(" " + s + " ", add_special_tokens=False)["input_ids"]) for s in facts.needles
    )
    doc_tokens = min(length, model.max_prompt_tokens) - overhead - PROMPT_SLACK - needle_tokens
    case = make_qa_case(split, index, depth, length, doc_tokens, tokenizer=model.tokenizer)
    text, _ = insert_at_depths(case.document, list(facts.needles), needle_depths(min(depth + 0.05, 0.9), 3))
    questions = [
        dict(kind=f"needle{i + 1}", task="s-rt", question=single_question(needle), references=[needle], keywords=[code])
        for i, (needle, code) in enumerate(zip(facts.needles, facts.keywords))
    ]
    questions.append(dict(kind="qa", task="qa", question=case.question, references=list(case.references), keywords=[]))
    return dict(doc_id=f"{case.case_id}", length=length, document=text, questions=questions)


def file_bytes(state: Prefilled, bits: int, window: int) -> int:
    """Bytes of the safetensors tensors a .cake of this cache holds at `bits` (positions included, the
    metadata header left out: it holds the document text, the same for every row)."""
    coding = value_coding_of(state.cache)
    tensors = cache_tensors(state.cache, bits, DEFAULT_KV_GROUP, window, DEFAULT_KV_SINK, **coding)
    return len(save_tensors(tensors))


def held_as_file(state: Prefilled, bits: int, window: int) -> Prefilled:
    """`state` held as a .cake file of `bits` holds it in memory once loaded (global layers quantized)."""
    held = dict(sink=DEFAULT_KV_SINK, in_memory=True, **value_coding_of(state.cache))  # as a file
    return requantized(state, bits, DEFAULT_KV_GROUP, window, **held)


def evicted_by_scores(rec, scores, config: CakeConfig) -> Prefilled:
    """A copy of the recorded prefix `rec` (`engine.replay.Recording`) evicted by reconstruction `scores` under
    `config`'s allocation (`engine.reconstruct.evict_by_scores`), as a compressed file would hold it."""
    cache = clone_cache(rec.cache)
    budgets = evict_by_scores(cache, scores, config)
    cascade = SavedCascade(scores.stats, budgets, budgets is not None, scores.seconds)
    kv = cache.kv_bytes()
    return Prefilled(cache, cascade, rec.logits, rec.seconds, cache.lengths(), kv, kv)


class FirstToken:
    """An `on_token` callback that records the seconds from `began` to the first token (None before it)."""

    def __init__(self, began: float):
        self.began, self.seconds = began, None

    def __call__(self, _token: int) -> None:
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.began


class DocumentRun:
    """Every row of one document (module docstring): compress each agnostic row once, answer every question."""

    def __init__(self, model: Model, doc: dict, configs: Callable[[int], CakeConfig], on_step=None):
        self.model, self.doc, self.configs, self.on_step = model, doc, configs, on_step or (lambda _: None)
        tok, template = model.tokenizer, load_template(TEMPLATE)
        self.device = model.model.get_input_embeddings().weight.device
        self.prefix, _ = render_split(tok, template, doc["document"], question="?")
        self.suffixes = [
            render_split(tok, template, doc["document"], question=q["question"])[1] for q in doc["questions"]
        ]
        self.n = len(self.prefix)
        self.template = template
        self.rows: list[dict] = []

    def budget(self, ratio: float) -> int:
        """B of a keep ratio: round(r · n), at least w + 1 (planning refuses a budget that keeps the window only)."""
        window = self.configs(max(self.n // 2, 64)).window
        return max(window + 1, round(ratio * self.n))

    def prompt(self, q: int) -> torch.Tensor:
        return torch.tensor([self.prefix + self.suffixes[q]], device=self.device)  # [1, n + q]

    def answer(self, row: str, ratio, bits: int, state: Prefilled, config, size: int) -> None:
        """Every question of the document from one compressed prefix `state` (a copy per question)."""
        model = self.model
        for q, spec in enumerate(self.doc["questions"]):
            ids = self.prompt(q)
            sync_device(self.device)
            first = FirstToken(time.perf_counter())
            result = continue_and_decode(
                model.model, state, ids, config, max_new_tokens=self.template.max_new_tokens,
                stop_ids=model.stop_ids, on_token=first,
            )  # fmt: skip
            self.add(row, ratio, bits, q, spec, result.token_ids, size, state, first.seconds)

    def add(self, row, ratio, bits, q, spec, tokens, size, state, first_seconds) -> None:
        text = self.model.tokenizer.decode(list(tokens), skip_special_tokens=True).strip()
        refs, keys = spec["references"], spec["keywords"]
        self.rows.append(
            dict(
                doc_id=self.doc["doc_id"], length=self.doc["length"], prefix_tokens=self.n, row=row, ratio=ratio,
                budget=None if ratio is None else self.budget(ratio), bits=bits, question=q, kind=spec["kind"],
                score=score_answer(spec["task"], text, refs, keys), exact=exact_answer(spec["task"], text, refs, keys),
                prediction=text, file_bytes=size, kv_bytes=state.kv_bytes, first_token_seconds=first_seconds,
            )
        )  # fmt: skip

    def run(self, ratios, bits_list) -> dict:
        """All rows; returns the document's timings (prefill, reconstruction) next to `self.rows`."""
        model, n = self.model, self.n
        base = self.configs(self.budget(ratios[0]))
        window = base.window
        prefix = torch.tensor([self.prefix], device=self.device)  # [1, n]
        self.on_step(f"{self.doc['doc_id']} @ {self.doc['length']}: prefill of the {n}-token prefix")
        rec = record(model.model, prefix, window, accumulate=False)
        whole = replay(rec, None)
        full16 = file_bytes(whole, 16, window)
        for bits in bits_list:
            state = held_as_file(whole, bits, window)
            self.answer("full", None, bits, state, None, file_bytes(whole, bits, window))
        self.on_step(f"{self.doc['doc_id']}: reconstruction of the document")
        repeat, target = self.reconstruction_ids()
        scores = reconstruction_scores(model.model, rec.cache, repeat, target, base)
        probe = render_split(model.tokenizer, self.template, self.doc["document"], question="")[1][-window:]
        probe_rec = record(
            model.model, torch.tensor([self.prefix + probe], device=self.device), window, accumulate=False
        )
        for ratio in ratios:
            budget = self.budget(ratio)
            config = self.configs(budget)
            self.on_step(f"{self.doc['doc_id']}: keep {ratio:.0%} (B = {budget})")
            self.aware(config, ratio, full16)
            for row in AGNOSTIC:
                state, cfg = self.compressed(row, rec, probe_rec, scores, config, len(probe))
                for bits in bits_list:
                    held, size = held_as_file(state, bits, window), file_bytes(state, bits, window)
                    self.answer(row, ratio, bits, held, cfg, size)
        return dict(prefill_seconds=rec.seconds, reconstruction_seconds=scores.seconds, full_file_bytes=full16)

    def aware(self, config: CakeConfig, ratio: float, size: int) -> None:
        """Question-aware CAKE: each question's whole prompt prefilled and evicted with it in the window."""
        for q, spec in enumerate(self.doc["questions"]):
            ids = self.prompt(q)
            state = replay(record(self.model.model, ids, config.window, accumulate=False), config)
            result = decode(self.model.model, ids, state, config, max_new_tokens=self.template.max_new_tokens,
                            stop_ids=self.model.stop_ids)  # fmt: skip
            self.add("aware", ratio, 16, q, spec, result.token_ids, size, state, None)

    def compressed(self, row, rec, probe_rec, scores, config, probe_len) -> tuple[Prefilled, CakeConfig]:
        """The prefix compressed for one agnostic row at `config`'s budget, and the settings it decodes with."""
        if row in _ALLOCATION:
            cfg = replace(config, allocation=_ALLOCATION[row], indicator="cake")
            return evicted_by_scores(rec, scores, cfg), cfg
        cfg = with_method(config, _METHOD[row])
        if row.startswith("instruction"):
            return without_probe(replay(probe_rec, probe_config(cfg, probe_len)), self.n), cfg
        return replay(rec, cfg), cfg

    def reconstruction_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[1, p] the repeat prompt (the template's text before the document's end, then `REPEAT_INSTRUCTION`)
        and [1, t] the document's tokens (what the model is teacher-forced to repeat)."""
        user = self.template.user
        template = replace(self.template, user=user[: split_at(self.template)] + REPEAT_INSTRUCTION, fields=())
        head, repeat = render_split(self.model.tokenizer, template, self.doc["document"])
        if head != self.prefix:
            raise ValueError("the repeat prompt does not start with the document prefix")
        target = self.model.tokenizer(self.doc["document"], add_special_tokens=False)["input_ids"]
        return (torch.tensor([x], device=self.device) for x in (repeat, target))


def run_documents(
    model: Model, configs: Callable[[int], CakeConfig], documents, ratios, bits_list, previous: dict | None = None,
    save: Callable[[dict], None] | None = None, on_step=None,
) -> dict:  # fmt: skip
    """Every document of `documents` ((index, depth, length) each, split "eval"), resuming `previous` (a run's
    "agnostic" part made with the same settings: its documents are skipped); `save` gets the part after each
    document.

    Returns:
        {"settings", "rows" (one per answer), "timings" (one per document: prefill and reconstruction seconds,
        the full cache's file bytes)}.
    """
    settings = dict(template=TEMPLATE, ratios=list(ratios), bits=list(bits_list))
    data = dict(previous) if previous and previous.get("settings") == settings else {}
    data = {"settings": settings, "rows": list(data.get("rows", [])), "timings": list(data.get("timings", []))}
    done = {(t["doc_id"], t["length"]) for t in data["timings"]}
    for index, depth, length in documents:
        doc = agnostic_document(model, "eval", index, depth, length)
        if (doc["doc_id"], length) in done:
            continue
        run = DocumentRun(model, doc, configs, on_step)
        timing = run.run(list(ratios), list(bits_list))
        data["rows"] += run.rows
        data["timings"].append(dict(doc_id=doc["doc_id"], length=length, prefix_tokens=run.n, **timing))
        if save is not None:
            save(data)
    return data
