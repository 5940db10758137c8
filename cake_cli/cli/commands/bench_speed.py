"""`cake bench speed`: its options, checked here (no torch) before `cli.runners.bench_speed` loads the models."""

from __future__ import annotations

from typing import Annotated

import typer

from cake_cli.bench.suites import SPEED_DEFAULT, SPEED_METHODS
from cake_cli.cli import options as o
from cake_cli.cli.app import handled
from cake_cli.cli.bench_options import configs_for, int_list
from cake_cli.cli.commands.bench import bench_app
from cake_cli.errors import UsageError, unknown_names
from cake_cli.models.dtypes import check_dtype
from cake_cli.models.weights import check_weights


@bench_app.command("speed")
def speed(
    models: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="NAME[,NAME…]",
            show_default=False,
            help="Model(s), comma-separated (default: the embedded default model).",
        ),
    ] = None,
    budget: Annotated[
        int,
        typer.Option("--budget", "-b", metavar="TOKENS", help="B, tokens per layer on average, window included."),
    ] = 256,
    window: o.Window = None,
    lengths: Annotated[
        str, typer.Option(metavar="LIST", help="Prompt lengths in tokens, comma-separated.")
    ] = "1024,4096,8192,16384",
    methods: Annotated[
        str, typer.Option(metavar="LIST", help=f"Comma-separated: {', '.join(SPEED_METHODS)}.")
    ] = ",".join(SPEED_DEFAULT),
    dtypes: Annotated[
        str,
        typer.Option(
            metavar="LIST",
            help="Dtypes, comma-separated: every row in the first; the full cache and CAKE up to 8K tokens in the "
            "others.",
        ),
    ] = "auto",
    cli_tasks: Annotated[
        str, typer.Option(metavar="LIST", help="CLI tasks measured end to end with their templates ('' for none).")
    ] = "qa,summarize",
    cli_length: Annotated[
        int, typer.Option(metavar="TOKENS", help="Document length of the CLI, busy-core and kvpress rows.")
    ] = 8192,
    kvpress: Annotated[
        bool, o._flag("--kvpress", help="Also run kvpress's SnapKV (needs `bash benchmarks/kvpress_env.sh`).")
    ] = False,
    busy: Annotated[bool, o._flag("--busy", help="Also decode with a spinning process holding one core.")] = False,
    new_tokens: Annotated[int, typer.Option(metavar="N", help="Tokens generated per engine run.")] = 32,
    repeats: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Timed runs of every row (engine, CLI, busy core, kvpress), each block after one warm-up run; the "
            "median is reported with its spread. A timing target decides only on >= 3.",
        ),
    ] = 3,
    llama: Annotated[
        bool,
        o._flag(
            "--llama",
            help="Also run llama.cpp on the model's GGUF, same document, threads and tokens (needs the "
            "bench extra's llama-cpp-python).",
        ),
    ] = False,
    prefill_once: Annotated[
        bool,
        o._flag(
            "--prefill-once",
            help="Time one prefill per row and decode --repeats times from copies of its state (llama.cpp: its "
            "saved state): for long contexts, where a prefill takes minutes; prefill verdicts then say 'too few "
            "repeats'.",
        ),
    ] = False,
    rss: Annotated[
        bool,
        o._flag(
            "--rss",
            help="With --llama: also CAKE's and llama.cpp's peak process memory at every length, each engine "
            "alone in a child process (one more prefill each).",
        ),
    ] = False,
    openvino: Annotated[
        bool,
        o._flag(
            "--openvino",
            help="Also run OpenVINO GenAI on the same checkpoint (int8 IR), its full cache and its KV-cache eviction "
            "at the same budget (needs `bash benchmarks/openvino_env.sh`).",
        ),
    ] = False,
    peak: Annotated[
        bool,
        o._flag(
            "--peak",
            help="Also split one prefill of the full cache and of CAKE at every length into linear layers, attention "
            "and the rest, each against the host's GEMM peak at the model's own shapes (float32, bf16 where native, "
            "int8 through w8a8's kernel); printed first.",
        ),
    ] = False,
    select: Annotated[
        bool,
        o._flag(
            "--select",
            help="Also time `cake qa --prefill select` (CAKE after GemFilter's selection) beside the CLI's qa rows; "
            "at --cli-length 16384 or more, its target line (first token >= 3x sooner than the full prefill).",
        ),
    ] = False,
    weights: o.Weights = "bf16",
    attention: o.Attention = "auto",
    json_out: o.Json = False,
) -> None:
    """Prefill seconds, time to first token, decode tokens/s, KV bytes (kept and peak during prefill), peak
    process memory and eviction overhead of each method, side by side in one run, with ratios vs the full
    cache and the decode limit; optionally the CLI's own tasks, a busy core and kvpress; then the targets
    (PASS / FAIL, "within noise" when the target lies within the repeats' spread)."""
    with handled():
        sizes = int_list(lengths, "--lengths")
        names = [m.strip() for m in methods.split(",") if m.strip()]
        unknown = [m for m in names if m not in SPEED_METHODS]
        if unknown:
            raise unknown_names("method(s)", unknown, SPEED_METHODS)
        tasks = [t.strip() for t in cli_tasks.split(",") if t.strip()]
        if any(t not in ("qa", "summarize") for t in tasks):
            raise UsageError(f"--cli-tasks takes qa and summarize, got '{cli_tasks}'")
        if select and "qa" not in tasks:
            raise UsageError(
                "--select times `cake qa --prefill select` beside the CLI's qa rows", "keep qa in --cli-tasks"
            )
        if rss and not llama:
            raise UsageError("--rss compares CAKE's process memory with llama.cpp's", "add --llama")
        if new_tokens < 2 or repeats < 1:
            raise UsageError("--new-tokens must be >= 2 and --repeats >= 1")
        model_list = [m.strip() for m in models.split(",")] if models else [None]
        dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
        for d in dtype_list:
            check_dtype(d)
        configs = {m: configs_for(m, window, [budget])[budget] for m in model_list}
        from cake_cli.cli.runners import bench_speed  # noqa: PLC0415 - torch loads after the checks

        bench_speed.speed(
            bench_speed.SpeedSetup(
                model_list,
                dtype_list,
                configs,
                sizes,
                names,
                new_tokens,
                repeats,
                tasks,
                cli_length,
                kvpress,
                busy,
                attention,
                json_out,
                llama,
                check_weights(weights),
                prefill_once,
                rss,
                openvino,
                peak,
                select,
            )
        )
