"""`cake compress` (a document's compressed KV cache, saved as a .cake file) and `cake chat` (question
after question on one compressed document). Every option, path and .cake header is checked here
before `cli.runners.compress` loads torch and the model."""

from __future__ import annotations

from typing import Annotated

import typer

from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled
from cake_cli.cli.commands.tasks import checked_plan, resolve_document, task_request
from cake_cli.cli.options import PrefillOptions, TaskOptions, with_options
from cake_cli.cli.progress import StderrProgress
from cake_cli.engine.config import KV_BITS
from cake_cli.errors import UsageError, unknown_name
from cake_cli.files import check_writable
from cake_cli.tasks.request import COMPRESS
from cake_cli.tasks.saved.fileformat import DEFAULT_SCORING, SCORINGS, SUFFIX, is_cache_path
from cake_cli.tasks.saved.request import check_scoring_method, scoring_request

CakeOutput = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE.cake",
        show_default=False,
        help="Where to save the compressed cache (written atomically); tasks take it in place of the document.",
    ),
]
Scoring = Annotated[
    str,
    typer.Option(
        "--scoring",
        metavar="|".join(SCORINGS).upper(),
        help="When the document is scored: question = keep the prefix whole and let each question evict it "
        "(question-aware quality, full-size file); end / instruction = evict now, question-agnostic (B·L tokens "
        "on disk), with the window holding the document's last w tokens / a question-less instruction; "
        "reconstruct = evict now by the attention of the model repeating the document (KVzip; 4-5x a "
        "prefill's time on CPU; B·L tokens on disk; --method cake, --allocation uniform or --allocation global).",
    ),
]


def kv_bits_option(help_text: str, kind: type = int):
    """The `--kv-bits` option type (16, 8, 4 or 2; checked by `check_kv_bits`) with its command's help; `kind`
    `int | None` where leaving it out means the model profile's."""
    return Annotated[kind, typer.Option("--kv-bits", metavar="|".join(map(str, KV_BITS)), help=help_text)]


KvBits = kv_bits_option(
    "Bits per key/value in the .cake file: 16 = the model's dtype; 8, 4 or 2 = grouped affine quantization "
    "(KIVI: keys per channel in groups of 32 tokens, values per token in Hadamard-rotated groups of 64 "
    "channels, the first 4 tokens and the observation window kept exact; 2 bits loses more answers, see "
    "benchmarks/cache.md). The file "
    "shrinks, and so does memory while answering: a loaded file keeps its global layers quantized "
    "(local sliding-window layers and per-head-length layers are dequantized). Default: the model profile's "
    "kv_bits (`cake profiles show`), the smallest file whose answers measured the same as 16 bits: 4 on the "
    "default model, 16 where not yet shown.",
    int | None,
)
ChatKvBits = kv_bits_option(
    "Bits per key/value the compressed document is held at in memory: 16 = the model's dtype; 8, 4 or 2 = "
    "KIVI's grouped affine quantization as `cake compress --kv-bits` saves it (global layers; the "
    "observation window and every question's tokens kept in the model's dtype)."
)


def check_kv_bits(bits: int) -> None:
    """Raises UsageError for a --kv-bits other than 16, 8, 4 or 2."""
    if bits not in KV_BITS:
        raise UsageError(f"--kv-bits {bits} is not supported", f"choose one of {', '.join(map(str, KV_BITS))}")


def check_scoring(scoring: str) -> None:
    """Raises UsageError for an unknown --scoring."""
    if scoring not in SCORINGS:
        raise unknown_name("--scoring", scoring, SCORINGS)


@app.command()
@with_options(PrefillOptions)
def compress(
    document: o.SourceDocument = None,
    output: CakeOutput = "",
    scoring: Scoring = DEFAULT_SCORING,
    kv_bits: KvBits = None,
    *,
    opts: PrefillOptions,
) -> None:
    """Prefill a document once and save its CAKE-compressed KV cache as a .cake file: then `cake qa FILE.cake
    QUESTION`, `cake summarize FILE.cake`, `cake needle FILE.cake QUERY` and `cake chat FILE.cake` skip the
    prefill. The report goes to stderr (--json: one JSON object on stdout)."""
    with handled():
        if not output:
            raise UsageError("compress needs --output FILE.cake", "e.g. cake compress report.pdf -o report.cake")
        if not output.lower().endswith(SUFFIX):
            raise UsageError(f"--output {output} does not end in {SUFFIX}", f"name it e.g. report{SUFFIX}")
        check_scoring(scoring)
        if kv_bits is not None:
            check_kv_bits(kv_bits)
        source = resolve_document(document)
        if is_cache_path(source):
            raise UsageError(f"{source} is already a compressed cache", "give the document it was made from")
        target = check_writable(output, "--output")
        progress = StderrProgress(opts.quiet)
        checked = checked_plan(scoring_request(task_request(COMPRESS, source, {}, opts), scoring), progress)
        check_scoring_method(checked, scoring)
        from cake_cli.cli.runners import compress as sessions  # noqa: PLC0415 - torch loads after the checks

        sessions.compress_and_save(checked, opts, progress, target, scoring, kv_bits)


@app.command()
@with_options(TaskOptions)
def chat(
    document: o.RequiredDocument,
    scoring: Scoring = DEFAULT_SCORING,
    kv_bits: ChatKvBits = 16,
    *,
    opts: TaskOptions,
) -> None:
    """Ask question after question about one document (or a .cake file): it is compressed once, then every
    answer streams to stdout. Questions come one a line from the terminal (with line editing and history)
    or from piped stdin; --json prints one JSON line per turn. Ctrl-C stops the answer being written and
    asks for the next question; Ctrl-D or exit leaves (exit code 0), and so does Ctrl-C at the prompt
    (exit code 130). Each turn starts again from the compressed document, so memory stays bounded and
    turns do not see each other."""
    with handled():
        check_scoring(scoring)
        check_kv_bits(kv_bits)
        if kv_bits != 16 and is_cache_path(document):
            raise UsageError(
                f"--kv-bits {kv_bits} sets how a document compressed now is held; {document} keeps the bits it "
                "was saved with", "drop --kv-bits, or give the document (cake compress --kv-bits saves a file)"
            )  # fmt: skip
        if document == "-":
            raise UsageError("chat reads its questions from stdin", "give the document as a file or a .cake file")
        output = check_writable(opts.output, "--output") if opts.output else None
        progress = StderrProgress(opts.quiet)
        checked = checked_plan(
            scoring_request(task_request("qa", document, {"question": "?"}, opts), scoring), progress
        )
        check_scoring_method(checked, scoring)
        from cake_cli.cli.runners import compress as sessions  # noqa: PLC0415 - torch loads after the checks

        sessions.chat(checked, opts, progress, output, scoring, kv_bits)
