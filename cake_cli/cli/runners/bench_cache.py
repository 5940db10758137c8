"""`cake bench cache` after its options were checked: load the model once, run the parts, print tables
(stdout) or one JSON object; the heavy half of `cli.commands.bench_cache`."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from cake_cli.bench.agnostic import report as agnostic_report
from cake_cli.bench.agnostic import run as agnostic
from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.quality.run import Model as QualityModel
from cake_cli.bench.reuse import (
    QUESTION,
    document_file,
    end_to_end,
    first_token,
    first_token_targets,
    quality_rows,
    summarize_quality,
)
from cake_cli.bench.suites import Suite
from cake_cli.cli.bench_options import CacheBenchSetup
from cake_cli.cli.progress import console, stderr_console
from cake_cli.cli.runners.bench_common import command_line, machine
from cake_cli.files import write_atomic
from cake_cli.models.profiles import model_spec, profile_of
from cake_cli.tasks.planning import cake_config_for
from cake_cli.tasks.request import Callbacks, TaskRequest
from cake_cli.tasks.runner import prompt_limit, ready_model, stop_token_ids
from cake_cli.tasks.saved.fileformat import DEFAULT_SCORING
from cake_cli.tasks.saved.store import file_bits
from cake_cli.tasks.templates import build_prompt, load_template
from cake_cli.tasks.threads import using

TEMPLATE_SLACK = 8  # tokens kept free where the document meets the template


def template_allowance(tokenizer) -> int:
    """Prompt tokens of the qa prompt that are not the document (chat opening, instruction, question)."""
    template = load_template("qa")
    return (
        len(build_prompt(tokenizer, template, "", max_prompt_tokens=10**9, question=QUESTION).input_ids)
        + TEMPLATE_SLACK
    )


def run(setup: CacheBenchSetup) -> None:
    """Run the chosen parts (`cli.commands.bench_cache.PARTS`) and show their numbers (or one JSON object)."""
    model, budget, window, dtype, parts = setup.model, setup.budget, setup.window, setup.dtype, setup.parts
    length, repeats, new_tokens, configs, output = (
        setup.length,
        setup.repeats,
        setup.new_tokens,
        setup.configs,
        setup.output,
    )
    err = stderr_console()

    def status(message: str) -> None:
        err.print(f"[dim]{escape(message)}[/]")

    request = TaskRequest(task="qa", document="-", model=model, budget=budget, window=window, dtype=dtype)
    data: dict = {"meta": {"command": command_line(), "question": QUESTION}}
    with using(setup.threads):
        data["meta"]["machine"] = machine()
        ready = ready_model(request, Callbacks(on_status=status))
        loaded = ready.loaded
        data["meta"].update(model=loaded.name, dtype=str(loaded.dtype).replace("torch.", ""), budget=budget)
        with tempfile.TemporaryDirectory(prefix="cake-bench-cache-") as tmp:
            doc = document_file(
                loaded.tokenizer, python_docs_text(), length - template_allowance(loaded.tokenizer), Path(tmp)
            )
            cake = Path(tmp) / "document.cake"
            if "timing" in parts or "e2e" in parts:
                data["timing"] = []
                bits = file_bits(None, loaded.profile)[0]  # the file `cake compress` writes by default
                for scoring in ("instruction", DEFAULT_SCORING) if "timing" in parts else (DEFAULT_SCORING,):
                    status(f"first token ({scoring}, {bits}-bit): compress, then {repeats} x (prefill vs saved cache)")
                    t = first_token(ready, request, doc, cake, repeats, scoring, bits)  # the default's file stays
                    data["timing"].append({**vars(t), "speedup": t.speedup, "file_ratio": t.file_ratio})
                if "timing" in parts:
                    data["timing_targets"] = first_token_targets(data["timing"], DEFAULT_SCORING)
            if "e2e" in parts:
                status(f"end to end: {repeats} x `cake qa DOC` and `cake qa FILE.cake` as fresh processes")
                common = [QUESTION, "-n", str(new_tokens), "--quiet"]
                spec = model_spec(model)
                args_doc = ["qa", str(doc), *common, "-m", spec, "-b", str(budget), "--dtype", data["meta"]["dtype"]]
                doc_s, cake_s = end_to_end(args_doc, ["qa", str(cake), *common], repeats)
                data["e2e"] = {"doc_seconds": doc_s, "cake_seconds": cake_s, "speedup": doc_s / cake_s}
        qmodel = QualityModel(loaded.model, loaded.tokenizer, prompt_limit(loaded, 64), stop_token_ids(loaded))
        if "quality" in parts:
            cases = Suite(**setup.suite, split="eval").specs()
            rows = quality_rows(qmodel, configs, cases, setup.haystack, on_step=status)
            data["quality"] = {"summary": summarize_quality(rows), "rows": rows}
        if "agnostic" in parts:
            data["agnostic"] = agnostic_part(setup, qmodel, data, status)
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    if output is not None:
        write_atomic(output, text, "--output")
    if setup.plot is not None and "agnostic" in data:
        title = (
            f"compress once, ask many · {data['meta']['model']} · {', '.join(map(str, setup.suite['lengths']))} tokens"
        )
        agnostic_report.plot(data["agnostic"]["summary"], setup.plot, title)
    if setup.json_out:
        sys.stdout.write(text)
        return
    show(data)


def agnostic_part(setup: CacheBenchSetup, qmodel: QualityModel, data: dict, status) -> dict:
    """The agnostic part (`bench.agnostic`), resuming `setup.output` when it holds one made with the same
    settings, saving the whole run file after every document; with its summary, pairs and target lines."""
    previous = None
    if setup.output is not None and setup.output.exists():
        try:
            previous = json.loads(setup.output.read_text(encoding="utf-8")).get("agnostic")
        except (OSError, ValueError, AttributeError):
            previous = None
    profile = profile_of(setup.model)

    def config(budget: int):
        request = TaskRequest(task="bench", document="-", budget=budget, window=setup.window, method="cake")
        return cake_config_for(profile, request)[0]  # the agnostic files are ranked by the paper's CAKE

    def save(part: dict) -> None:
        if setup.output is not None:
            write_atomic(setup.output, json.dumps({**data, "agnostic": part}, indent=1, ensure_ascii=False) + "\n",
                         "--output")  # fmt: skip

    suite = setup.suite
    documents = [
        (index, suite["depths"][index % len(suite["depths"])], length)
        for length in suite["lengths"]
        for index in range(suite["repeats"])
    ]
    part = agnostic.run_documents(qmodel, config, documents, setup.ratios, setup.kv_bits, previous, save, status)
    summary = agnostic_report.summarize(part["rows"])
    lines = agnostic_report.targets(summary, part["timings"])
    lines += agnostic_report.first_token_lines(part["rows"], part["timings"])
    return {**part, "summary": summary, "paired": agnostic_report.paired(part["rows"]), "targets": lines}


def show_agnostic(out, part: dict) -> None:
    """The agnostic part's tables and target lines."""
    pairs = {(p["length"], p["row"], p["ratio"], p["bits"]): p for p in part["paired"]}
    table = Table(title="compress once, ask many: score and exact answers x 100 (vs question-aware CAKE: W/T/L)")
    for name in ("tokens", "keep", "row", "bits", "answers", "score", "exact", "file bytes", "KV bytes", "W/T/L"):
        table.add_column(name, justify="right")
    for s in part["summary"]:
        p = pairs.get((s["length"], s["row"], s["ratio"], s["bits"]))
        table.add_row(
            str(s["length"]), "-" if s["ratio"] is None else f"{s['ratio']:.0%}", s["row"], str(s["bits"]),
            str(s["answers"]), f"{s['score']:.1f}", f"{s['exact']:.1f}", f"{s['file_bytes']:,.0f}",
            f"{s['kv_bytes']:,.0f}", f"{p['wins']}/{p['ties']}/{p['losses']}" if p else "",
        )  # fmt: skip
    out.print(table)
    for line in part["targets"]:
        out.print(escape(line), highlight=False)


def show(data: dict) -> None:
    """The numbers as tables on stdout."""
    out = console(stderr=False)
    meta = data["meta"]
    out.print(f"[bold]cake bench cache[/] · {escape(meta['model'])} · {meta['dtype']} · B = {meta['budget']}")
    out.print(f"[dim]{escape(meta['machine'])}[/]")
    if "timing" in data:
        tokens = data["timing"][0]["prompt_tokens"]
        table = Table(title=f"time to first answer token, model loaded ({tokens}-token prompt)")
        for name in (".cake scoring", "prefill path", "saved .cake", "its pass", "speedup", ".cake bytes", "KV bytes",
                     "file/KV"):  # fmt: skip
            table.add_column(name, justify="right")
        for t in data["timing"]:
            table.add_row(
                t["scoring"], f"{t['prefill_seconds']:.2f} s", f"{t['saved_seconds']:.3f} s",
                f"{t['pass_seconds']:.3f} s", f"{t['speedup']:.1f}×", f"{t['file_bytes']:,}", f"{t['kv_bytes']:,}",
                f"{t['file_ratio']:.3f}",
            )  # fmt: skip
        out.print(table)
        for line in data.get("timing_targets", []):
            out.print(escape(line))
    if "e2e" in data:
        e = data["e2e"]
        out.print(
            f"end to end: `cake qa DOC` {e['doc_seconds']:.1f} s · `cake qa FILE.cake` {e['cake_seconds']:.1f} s · "
            f"{e['speedup']:.1f}× faster"
        )
    if "quality" in data:
        table = Table(title="question-aware vs question-agnostic (score and exact answers x 100)")
        for name in ("variant", "B", "cases", "score", "exact"):
            table.add_column(name, justify="right")
        for row in data["quality"]["summary"]:
            table.add_row(
                row["variant"], str(row["budget"] or "-"), str(row["cases"]), f"{row['score']:.1f}",
                f"{row['exact']:.1f}",
            )  # fmt: skip
        out.print(table)
    if "agnostic" in data:
        show_agnostic(out, data["agnostic"])
