"""`cake bench speed` after its options were checked: every model x dtype, the engine rows, the
CLI's own tasks, decoding with one core busy and kvpress side by side, in one invocation; then
the tables and the target lines (the heavy half of `cli.commands.bench`)."""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from rich.markup import escape

from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.speed import openvino
from cake_cli.bench.speed.llama import LlamaEngine, model_gguf
from cake_cli.bench.speed.openvino import openvino_rows
from cake_cli.bench.speed.paths import QUESTION, busy_core, cli_row, document_file, kvpress_row, safe, safe_rows
from cake_cli.bench.speed.peak import peak_row, split_prefill
from cake_cli.bench.speed.report import peak_tables, ratios, speed_tables
from cake_cli.bench.speed.rows import WARMUP_TOKENS, config_for, run_speed
from cake_cli.bench.speed.rss import ENGINES, ChildRun, memory_lines, process_peak
from cake_cli.bench.speed.targets import SELECT_METHOD, target_lines
from cake_cli.cli.progress import console, stderr_console
from cake_cli.cli.runners.bench_common import command_line, machine, progress_bar
from cake_cli.engine.config import CakeConfig
from cake_cli.errors import CakeError, UsageError
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.runner import ReadyModel, prompt_limit, ready_model
from cake_cli.tasks.threads import choose
from cake_cli.tasks.threads import using as threads_using


@dataclass(frozen=True)
class SpeedSetup:
    """A checked `cake bench speed` run."""

    models: list[str | None]
    dtypes: list[str]
    configs: dict  # model -> CakeConfig at --budget
    lengths: list[int]
    methods: list[str]
    new_tokens: int
    repeats: int
    cli_tasks: list[str]  # e.g. ["qa", "summarize"]; [] for none
    cli_length: int  # document length of the CLI, busy and kvpress rows (clamped to the model's limit)
    kvpress: bool
    busy: bool
    attention: str
    json_out: bool
    llama: bool = False  # llama.cpp rows beside the engine's (`speed.llama`)
    weights: str = "bf16"  # --weights of every row (`models.weights`)
    prefill_once: bool = False  # engine and llama.cpp rows: one timed prefill, `repeats` decodes from it
    rss: bool = False  # process memory of CAKE and llama.cpp in child processes (`speed.rss`)
    openvino: bool = False  # OpenVINO GenAI's full-cache and eviction rows (`speed.openvino`)
    peak: bool = False  # the prefill split and the GEMM peak at the model's shapes (`speed.peak`)
    select: bool = False  # a `cake qa --prefill select` row (CAKE) beside the CLI's qa rows


def _model_rows(
    setup: SpeedSetup, model: str | None, dtype: str, first: bool, on_case, warn, memory: list, peaks: list
) -> list:
    """Every row of one model in one dtype (the CLI, busy, kvpress and memory rows for the first dtype
    only; memory rows are appended to `memory`, `speed.peak` rows to `peaks`)."""
    request = TaskRequest(
        task="qa", document="-", model=model, dtype=dtype, attention=setup.attention, weights=setup.weights
    )
    ready = ready_model(request)
    loaded, base = ready.loaded, setup.configs[model]
    name = loaded.profile.name if loaded.profile else loaded.name
    label = str(loaded.dtype).replace("torch.", "") + ("" if loaded.weights == "bf16" else f"+{loaded.weights}")
    group = f"{name} · {label}"
    ids = loaded.tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"]
    limit = min(prompt_limit(loaded, setup.new_tokens + 256), len(ids))
    lengths = [n for n in setup.lengths if n <= limit]
    if not lengths:
        raise UsageError(
            f"{name} takes prompts of at most {limit} tokens; --lengths asks only for longer ones",
            f"ask for --lengths {limit} or less",
        )
    if len(lengths) < len(setup.lengths):
        warn(f"{name}: lengths above its {limit}-token prompt limit skipped")
    n = min(setup.cli_length, limit)
    if first and setup.kvpress and n not in lengths:  # kvpress is compared with our rows at its own length
        lengths.append(n)
    threads = choose(None)
    if setup.peak:
        peaks += _peak_rows(loaded.model, name, ids, lengths, base, setup, threads, on_case)
    with tempfile.TemporaryDirectory() as tmp:
        others = (
            _llama_engine(model, loaded, ids, lengths, group, threads, setup, on_case, warn, Path(tmp)) if first else []
        )
        rows = run_speed(
            loaded.model,
            ids,
            base,
            group=f"{group} · engine",
            lengths=lengths,
            methods=setup.methods,
            threads=threads,
            new_tokens=setup.new_tokens,
            repeats=setup.repeats,
            on_case=on_case,
            prefill_once=setup.prefill_once,
            others=others,
            warn=warn,
        )
        del others  # llama.cpp's model and saved states
    if not first:
        return rows
    if setup.openvino:
        rows += _openvino_rows(loaded, ids, lengths, group, base, threads, setup, on_case, warn)
    if setup.rss:
        memory += _memory_rows(model, loaded, ids, lengths, name, base, threads, setup, on_case, warn)
    rows += _path_rows(setup, ready, request, ids[:n], group, base, on_case, warn)
    return rows


def _peak_rows(model, name: str, ids, lengths: list[int], base: CakeConfig, setup, threads, on_case) -> list[dict]:
    """`speed.peak.peak_row` for the full cache and CAKE (those of --methods) at every length, on the
    prefill's threads, after one warm-up prefill; as dicts (`PeakRow.to_dict`)."""
    device = model.get_input_embeddings().weight.device
    methods = [m for m in ("full", "cake") if m in setup.methods] or setup.methods[:1]
    rows = []
    with threads_using(threads.prefill):
        split_prefill(model, torch.tensor([ids[:WARMUP_TOKENS]], device=device), None)  # warm-up, not measured
        for n in lengths:
            for method in methods:
                on_case(f"{name}: prefill against the peak, {method} @ {n} tokens")
                ids_n = torch.tensor([ids[:n]], device=device)
                rows.append(peak_row(model, name, ids_n, config_for(method, base), method).to_dict())
    return rows


def _gguf_once(model, loaded, folder: Path):
    """A function returning the model's GGUF for llama.cpp (`speed.llama.model_gguf`), joined and
    checked into `folder` on the first call only (the same file serves every length)."""
    embedded = loaded.profile.embedded if loaded.profile else None
    return functools.cache(lambda: model_gguf(model, embedded, folder))


def _memory_rows(model, loaded, ids, lengths, name, base, threads, setup, on_case, warn) -> list:
    """CAKE's and llama.cpp's peak process memory at every length, each in a child process
    (`speed.rss`); one warning line where one cannot run."""
    out: list = []
    dtype = str(loaded.dtype).replace("torch.", "")
    with tempfile.TemporaryDirectory() as tmp:
        gguf = _gguf_once(model, loaded, Path(tmp))
        for n in lengths:
            for engine in ENGINES:

                def make(n=n, engine=engine):
                    on_case(f"{name}: process memory, {engine} @ {n} tokens")
                    spec = str(gguf()) if engine == "llama.cpp" else model
                    run = ChildRun(
                        engine, spec, dtype, setup.weights, setup.attention, asdict(base), setup.new_tokens,
                        (threads.prefill, threads.decode),
                    )  # fmt: skip
                    return process_peak(run, list(ids[:n]), name)

                out += safe(f"{engine} process memory", make, warn)
    return out


def _llama_engine(model, loaded, ids, lengths, group, threads, setup, on_case, warn, folder: str | Path) -> list:
    """[llama.cpp on the model's GGUF, ready to run in the engine rows' rounds (`speed.llama.LlamaEngine`)],
    or [] when --llama is off or it cannot run (one warning line)."""
    if not setup.llama:
        return []

    def make():
        on_case(
            f"{group}: llama.cpp, loading and warming up" + (", one prefill per length" if setup.prefill_once else "")
        )
        return LlamaEngine(
            model_gguf(model, loaded.profile.embedded if loaded.profile else None, folder),
            list(ids),
            f"{group} · llama.cpp",
            lengths=lengths,
            new_tokens=setup.new_tokens,
            threads=(threads.prefill, threads.decode),
            prefill_once=setup.prefill_once,
        )

    return safe("llama.cpp", make, warn)


def _openvino_rows(loaded, ids, lengths, group, base: CakeConfig, threads, setup, on_case, warn) -> list:
    """OpenVINO GenAI's two rows at every length (`speed.openvino`); one warning line where it cannot run."""

    def make(n: int) -> list:
        on_case(f"{group}: OpenVINO GenAI @ {n} tokens")
        openvino.require()  # before the float checkpoint, which a lean model converts first (minutes, GBs)
        checkpoint = loaded.float_checkpoint()
        if checkpoint is None:
            raise CakeError("OpenVINO GenAI needs the model's checkpoint folder", "load the model from a folder")
        return openvino_rows(
            checkpoint,
            list(ids[:n]),
            base.budget,
            base.window,
            f"{group} · openvino",
            new_tokens=setup.new_tokens,
            threads=(threads.prefill, threads.decode),
            repeats=setup.repeats,
        )

    return _each_length("OpenVINO GenAI", lengths, make, warn)


def _each_length(label: str, lengths: list[int], make, warn) -> list:
    """make(n) (a list of rows) at every length in turn; at the first that fails, one warning line
    (`speed.paths.safe_rows`) and no more lengths (they would fail the same way)."""
    rows: list = []
    for n in lengths:
        made = safe_rows(label, lambda n=n: make(n), warn)
        if not made:
            break
        rows += made
    return rows


def _path_rows(setup, ready: ReadyModel, request, ids, group, base: CakeConfig, on_case, warn) -> list:
    """The CLI rows, the busy-core rows and the kvpress row at one document length."""
    rows, n = [], len(ids)
    with tempfile.TemporaryDirectory() as tmp:
        doc = document_file(ready.loaded.tokenizer, ids, Path(tmp))
        warm = document_file(ready.loaded.tokenizer, ids[:WARMUP_TOKENS], Path(tmp))
        for task in setup.cli_tasks:
            fields = {"question": QUESTION} if task == "qa" else {}
            task_request = replace(request, task=task, document=str(doc), fields=fields, budget=base.budget)
            for method in ("full", "cake"):
                row = cli_row(
                    ready, task_request, f"{group} · cli {task}", method, on_case, repeats=setup.repeats, warmup=warm
                )
                rows.append(row)
            if task == "qa" and setup.select:  # GemFilter's selection, then CAKE (`engine.selection`)
                selecting = replace(task_request, prefill="select")
                rows.append(
                    cli_row(
                        ready, selecting, f"{group} · cli {task}", "cake", on_case, repeats=setup.repeats,
                        warmup=warm, label=SELECT_METHOD,
                    )
                )  # fmt: skip
    if setup.busy:  # the same case back to back: quiet, then with one core busy
        for label in ("quiet", "busy"):
            with busy_core() if label == "busy" else nullcontext():
                rows += run_speed(
                    ready.loaded.model,
                    ids,
                    base,
                    group=f"{group} · {label}",
                    lengths=[n],
                    methods=["cake"],
                    threads=choose(None),
                    new_tokens=setup.new_tokens,
                    repeats=setup.repeats,
                    on_case=on_case,
                )[:1]
    if setup.kvpress and ready.loaded.path is not None:
        threads = choose(None)
        dtype = str(ready.loaded.dtype).replace("torch.", "")

        def make():
            on_case(f"{group}: kvpress snapkv @ {n}")
            return kvpress_row(
                ready.loaded.float_checkpoint(),
                list(ids),
                base.budget,
                f"{group} · kvpress",
                new_tokens=setup.new_tokens,
                threads=(threads.prefill, threads.decode),
                dtype=dtype,
                repeats=setup.repeats,
            )

        rows += safe("kvpress", make, warn)
    return rows


def speed(setup: SpeedSetup) -> None:
    """Run every row (progress on stderr), then print the tables and the target lines (or JSON)."""
    err = stderr_console()
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        err.print(f"[yellow]warning:[/] {escape(message)}")

    rows, memory, peaks = [], [], []
    with progress_bar() as bar:
        task = bar.add_task("bench speed", total=None)

        def on_case(label: str) -> None:
            bar.update(task, description=label)
            bar.advance(task)

        for model in setup.models:
            for i, dtype in enumerate(setup.dtypes):
                rows += _model_rows(setup, model, dtype, i == 0, on_case, warn, memory, peaks)
    data = ratios(rows)
    checks = target_lines(data) + memory_lines(memory)
    meta = {
        "budget": [c.budget for c in setup.configs.values()][0],
        "new_tokens": setup.new_tokens,
        "repeats": setup.repeats,
        "machine": machine(),
        "command": command_line(),
        "warnings": warnings,
    }
    if setup.json_out:
        payload = {"meta": meta, "rows": data, "memory": [asdict(m) for m in memory], "checks": checks}
        if setup.peak:
            payload["peak"] = peaks
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    out = console(stderr=False)
    title = f"cake bench speed · B = {meta['budget']} · {meta['machine']}"
    for table in peak_tables(peaks, title) + speed_tables(data, title):
        out.print(table)
    for m in memory:
        out.print(
            f"process memory · {m.model} · {m.engine} at {m.length} tokens: peak RSS {m.rss_peak / 2**20:.0f} MiB, "
            f"{m.run_peak / 2**20:.0f} MiB while prefilling and decoding (its prefill {m.prefill_seconds:.1f} s)"
        )
    for line in checks:
        out.print(escape(line))
