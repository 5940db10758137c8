"""CLI options declared once and shared by every task command (names and help never drift)."""

from __future__ import annotations

from typing import Annotated

import typer

# The flag of each engine setting (`engine.config.ConfigError.field`), for error messages.
FLAGS = {
    "budget": "--budget",
    "window": "--window",
    "decode_policy": "--decode-policy",
    "method": "--method",
    "allocation": "--allocation",
    "indicator": "--indicator",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "no_repeat_ngram_size": "--no-repeat-ngram",
}

Document = Annotated[
    str | None,
    typer.Argument(
        help="Document: a PDF, a text file, or '-' for stdin (default: stdin when piped).", show_default=False
    ),
]
RequiredDocument = Annotated[
    str, typer.Argument(help="Document: a PDF, a text file, or '-' for stdin.", show_default=False)
]
SourceFile = Annotated[
    str | None,
    typer.Argument(help="Source file to continue, or '-' for stdin (default: stdin when piped).", show_default=False),
]
InspectDocument = Annotated[
    str | None,
    typer.Argument(
        help="Document: a PDF, a text file, or '-' for stdin (default: a short packaged sample story).",
        show_default=False,
    ),
]
Question = Annotated[
    str, typer.Argument(help="The question; it ends the prompt, inside CAKE's observation window.", show_default=False)
]
Query = Annotated[
    str, typer.Argument(help="What to look for, e.g. a question the passage answers.", show_default=False)
]
ProfileName = Annotated[
    str, typer.Argument(help="Profile name or alias (see `cake profiles list`).", show_default=False)
]
AtLine = Annotated[
    int | None,
    typer.Option(
        "--at",
        show_default=False,
        help="Complete from this 1-based line: the context is the file before it (default: after the last line).",
    ),
]
Lines = Annotated[int, typer.Option("--lines", "-l", help="Most lines of code to print.")]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        envvar="CAKE_MODEL",
        show_default=False,
        help="Profile name or alias (see `cake profiles list`), local model dir, .gguf file, or cached hub id. "
        "Default: the embedded SmolLM2-135M-Instruct.",
    ),
]
Budget = Annotated[
    int,
    typer.Option(
        "--budget", "-b", help="KV cache budget B in tokens per layer on average, window included (B·L slots in all)."
    ),
]
Window = Annotated[
    int | None,
    typer.Option(
        "--window", "-w", show_default=False, help="Observation window w in tokens (default: the profile's, 32)."
    ),
]
DecodePolicy = Annotated[
    str,
    typer.Option(
        "--decode-policy",
        help="fixed: each layer keeps its size while decoding (one eviction per token); grow: new tokens are appended.",
    ),
]
Dtype = Annotated[
    str, typer.Option("--dtype", help="auto (float32 on CPU, the profile's on CUDA), float32, bfloat16 or float16.")
]
Attention = Annotated[
    str,
    typer.Option(
        "--attention",
        help="Attention backend: auto (flash_attention_2 on CUDA with flash-attn, else sdpa), "
        "sdpa, eager, flash_attention_2.",
    ),
]
DeviceMap = Annotated[
    str | None,
    typer.Option(
        "--device-map", show_default=False, help="Pass 'auto' to spread a large model over GPUs/CPU (accelerate)."
    ),
]
MaxNewTokens = Annotated[
    int | None,
    typer.Option(
        "--max-new-tokens", "-n", show_default=False, help="Most tokens to generate (default: the task template's)."
    ),
]
Temperature = Annotated[float, typer.Option("--temperature", help="0 = greedy; > 0 samples.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (with --temperature > 0).")]
Seed = Annotated[int | None, typer.Option("--seed", show_default=False, help="Random seed for sampling.")]
NoRepeatNgram = Annotated[
    int | None,
    typer.Option(
        "--no-repeat-ngram",
        show_default=False,
        help="Forbid repeating any n-gram of this many tokens (0 = off; default: the task template's).",
    ),
]
Truncate = Annotated[
    str,
    typer.Option(
        "--truncate", help="middle: keep the head and tail of a too-long document (with a warning); error: refuse."
    ),
]
Password = Annotated[str | None, typer.Option("--password", show_default=False, help="Password of an encrypted PDF.")]
Json = Annotated[
    bool, typer.Option("--json", help="Print one JSON object to stdout instead (for tasks: the answer and the report).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No report or progress on stderr (warnings still).")]
Method = Annotated[
    str,
    typer.Option(
        "--method",
        help="KV eviction method: cake (default), snapkv, pyramidkv, h2o, tova, streamingllm, or full "
        "(no eviction). A method pairs an allocation with an indicator.",
    ),
]
Allocation = Annotated[
    str | None,
    typer.Option(
        "--allocation",
        show_default=False,
        help="Override the method's budget allocation across layers: cake, uniform or pyramid.",
    ),
]
Indicator = Annotated[
    str | None,
    typer.Option(
        "--indicator",
        show_default=False,
        help="Override the method's token indicator: cake, snapkv, h2o, tova or streaming.",
    ),
]
Output = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        show_default=False,
        help="Also write the answer (or the JSON with --json) to FILE, atomically: "
        "an interrupted run never leaves a partial file.",
    ),
]
