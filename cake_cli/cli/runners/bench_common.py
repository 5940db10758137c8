"""What the benchmark runners share: the machine and command lines of a results file, the model
loaded for a benchmark, and the progress bar on stderr."""

from __future__ import annotations

import os
import platform
import sys

import torch
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cake_cli.cli.progress import LineProgress, live_progress, stderr_console
from cake_cli.models.loader import LoadedModel
from cake_cli.tasks.runner import load_ready


def cpu_model() -> str | None:
    """The processor's model name from /proc/cpuinfo (Linux), e.g. "AMD EPYC"; None where unknown.
    Benchmarks print it: a virtual machine can move to another host's processor between runs."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def machine() -> str:
    """A one-line description of this machine (processor model where known)."""
    model = cpu_model()
    return (
        f"{platform.processor() or platform.machine()}{f' ({model})' if model else ''}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {platform.python_version()}"
    )


def command_line() -> str:
    """The command as the user typed it (for the results' meta)."""
    return "cake " + " ".join(sys.argv[1:])


def load(model: str | None, dtype: str, attention: str, weights: str = "bf16") -> LoadedModel:
    """Load a model for a benchmark and switch it to CAKE attention (status lines on stderr);
    `weights`: the linear layers' format (`models.weights`).

    Raises:
        CakeError: see `tasks.runner.load_ready`.
    """
    err = stderr_console()
    status = lambda m: err.print(f"[dim]{escape(m)}[/]")  # noqa: E731
    return load_ready(model, dtype, attention, on_status=status, weights=weights).loaded


def progress_bar() -> Progress | LineProgress:
    """The benchmarks' progress on stderr (label, bar, done/total, time left; plain lines when piped)."""
    return live_progress(
        stderr_console(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
    )
