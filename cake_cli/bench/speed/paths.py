"""`cake bench speed`, the paths users run: the CLI's tasks with their templates' defaults, kvpress's
SnapKV side by side, and decoding with another process holding a core.

- CLI rows run `tasks.runner.run_task` on a document file exactly as `cake qa` / `cake summarize`
  would (template, chat template, n-gram blocking, thread policy, streaming), on one loaded
  model; TTFT is the time from the call to the first streamed text.
- kvpress rows run NVIDIA's kvpress 0.5.5 in its own virtual environment (`.venv-kvpress`,
  made by benchmarks/kvpress_env.sh; it pins transformers < 5.3) on the same checkpoint folder.
- `busy_core()` keeps one core busy (a spinning process) while the block runs.

Every row here gets what the engine rows get (`rows.run_speed`): one unmeasured warm-up run of
`rows.WARMUP_TOKENS` prompt tokens and `rows.WARMUP_NEW_TOKENS` new tokens, then `repeats` timed
runs, the median reported and every repeat kept (`SpeedRow.samples`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from cake_cli.bench.speed.rows import TIMED, WARMUP_NEW_TOKENS, WARMUP_TOKENS, SpeedRow, median_row
from cake_cli.errors import CakeError, first_line
from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import Callbacks, TaskRequest
from cake_cli.tasks.runner import ReadyModel, run_task

REPO = Path(__file__).resolve().parents[3]  # the checkout: cake_cli/bench/speed/paths.py -> ./
KVPRESS_PYTHON = REPO / ".venv-kvpress" / "bin" / "python"
KVPRESS_SCRIPT = REPO / "benchmarks" / "kvpress_speed.py"
QUESTION = "What is this document about? Answer in one sentence."


def cli_row(
    ready: ReadyModel,
    request: TaskRequest,
    group: str,
    method: str,
    on_case: Callable[[str], None] | None = None,
    *,
    repeats: int = 3,
    warmup: Path | None = None,
    label: str | None = None,
) -> SpeedRow:
    """`repeats` timed `cake <task>` runs on `request` (its document a file) with the loaded model,
    after one unmeasured run on the `warmup` document (if given) with WARMUP_NEW_TOKENS new tokens;
    the row's method is `label` (default `method`)."""
    request = replace(request, method=method)
    if warmup is not None:
        if on_case:
            on_case(f"{group}: {request.task} {method} warm-up")
        run_task(plan(replace(request, document=str(warmup), max_new_tokens=WARMUP_NEW_TOKENS)), Callbacks(), ready)
    runs, threads = [], ""
    for r in range(repeats):
        if on_case:
            on_case(f"{group}: {request.task} {method}, run {r + 1}/{repeats}")
        result, ttft = _timed_run(ready, request)
        runs.append(
            {
                "prefill_seconds": result.prefill_seconds,
                "ttft_seconds": ttft,
                "decode_tokens_per_second": result.decode_tokens_per_second,
                "decode_steps": result.decode_steps,
                "kv_bytes_kept": result.kv_bytes_kept,
                "kv_peak_prefill": result.kv_peak_prefill,
                "kv_bytes_full": result.kv_bytes_full,
                "rss_peak_delta": 0,
                "eviction_seconds": result.eviction_seconds,
                "sampling_seconds": result.sampling_seconds,
                "decode_seconds": result.decode_seconds,
            }
        )
        threads = threads or f"{result.prefill_threads}/{result.decode_threads}"
    return median_row(group, result.prompt_tokens, label or method, result.budget, runs, threads)


def _timed_run(ready: ReadyModel, request: TaskRequest):
    """(the task's result, seconds from the call to its first streamed text)."""
    first: list[float] = []
    start = time.perf_counter()
    result = run_task(
        plan(request), Callbacks(on_text=lambda _: first.append(time.perf_counter()) if not first else None), ready
    )
    return result, (first[0] if first else time.perf_counter()) - start


def document_file(tokenizer, token_ids: list[int], folder: Path) -> Path:
    """A text file holding the decoded `token_ids` (the document of the CLI rows; its first
    `rows.WARMUP_TOKENS` tokens make the warm-up document)."""
    path = folder / f"document-{len(token_ids)}.txt"
    path.write_text(tokenizer.decode(token_ids), encoding="utf-8")
    return path


def kvpress_available() -> bool:
    """Whether .venv-kvpress and the runner script exist (a source checkout with the venv made)."""
    return KVPRESS_PYTHON.is_file() and KVPRESS_SCRIPT.is_file()


def kvpress_row(
    model_dir: Path,
    token_ids: list[int],
    budget: int,
    group: str,
    *,
    new_tokens: int,
    threads: tuple,
    dtype: str,
    repeats: int = 3,
) -> SpeedRow:
    """kvpress's SnapKV press on `token_ids` through its own pipeline, in its own venv: one
    unmeasured warm-up run (WARMUP_TOKENS, WARMUP_NEW_TOKENS), then `repeats` timed runs, as our rows.

    Raises:
        CakeError: the venv is missing (with the command that makes it) or the run failed.
    """
    if not kvpress_available():
        raise CakeError("kvpress is not set up", "run `bash benchmarks/kvpress_env.sh` (it makes .venv-kvpress)")
    args = {
        "--model-dir": model_dir,
        "--budget": budget,
        "--new-tokens": new_tokens,
        "--threads": threads[0],
        "--decode-threads": threads[1],
        "--dtype": dtype,
        "--repeats": repeats,
        "--warmup-tokens": WARMUP_TOKENS,
        "--warmup-new-tokens": WARMUP_NEW_TOKENS,
    }
    fix = "check .venv-kvpress (bash benchmarks/kvpress_env.sh)"
    data = run_json_script(KVPRESS_PYTHON, KVPRESS_SCRIPT, token_ids, args, "the kvpress run", fix)
    return external_row(data, "kvpress-snapkv", budget, group, threads)


def run_json_script(python: Path, script: Path, token_ids: list[int], args: dict, what: str, fix: str) -> dict:
    """Run `script` with another venv's `python`, the token ids in a JSON file (``--ids``) and
    `args` ({"--flag": value}); return the JSON object its last stdout line holds.

    Raises:
        CakeError: the script failed (its last stderr line, and `fix`).
    """
    with tempfile.TemporaryDirectory() as tmp:
        ids = Path(tmp) / "ids.json"
        ids.write_text(json.dumps(token_ids))
        cmd = [str(python), str(script), "--ids", str(ids)]
        for flag, value in args.items():
            cmd += [flag, str(value)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CakeError(f"{what} failed: {tail}", fix)
    return json.loads(done.stdout.strip().splitlines()[-1])


def external_row(data: dict, method: str, budget: int | None, group: str, threads: tuple) -> SpeedRow:
    """The SpeedRow of another engine's JSON row (benchmarks/kvpress_speed.py, openvino_speed.py:
    medians, `samples` per repeat, ``context_tokens``)."""
    return SpeedRow(
        group=group,
        length=data["context_tokens"],
        method=method,
        budget=budget,
        prefill_seconds=data["prefill_seconds"],
        ttft_seconds=data["ttft_seconds"],
        decode_tokens_per_second=data["decode_tokens_per_second"],
        decode_steps=data["decode_steps"],
        kv_bytes_kept=data.get("kv_bytes_kept", 0),
        kv_peak_prefill=0,
        kv_bytes_full=0,
        rss_peak_delta=0,
        eviction_seconds=0.0,
        sampling_seconds=0.0,
        decode_seconds=data["decode_steps"] / max(data["decode_tokens_per_second"], 1e-12),
        threads=f"{threads[0]}/{threads[1]}",
        repeats=data["repeats"],
        samples={key: tuple(values) for key, values in data.get("samples", {}).items() if key in TIMED},
    )


@contextmanager
def busy_core() -> Iterator[None]:
    """Keep one CPU core busy (a spinning Python process) inside the block."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it start spinning
        yield
    finally:
        spinner.kill()
        spinner.wait()


def safe(label: str, make: Callable[[], SpeedRow], warn: Callable[[str], None]) -> list[SpeedRow]:
    """[make()], or [] with a warning when it raises a CakeError (e.g. kvpress not set up)."""
    return safe_rows(label, lambda: [make()], warn)


def safe_rows(label: str, make: Callable[[], list[SpeedRow]], warn: Callable[[str], None]) -> list[SpeedRow]:
    """make(), or [] with a one-line warning naming `label` when it raises a CakeError."""
    try:
        return make()
    except CakeError as exc:
        warn(f"{label}: {first_line(exc)} — {exc.hint}" if exc.hint else f"{label}: {first_line(exc)}")
        return []
