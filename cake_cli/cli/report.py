"""Rich views of the result objects: the run report (stderr), the layer inspector (stdout), and
the per-layer allocation chart both share. Every number shown comes from the result dataclass
that --json prints, so the two never disagree."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cake_cli.tasks.results import InspectResult, LayerResult, Location, RunResult

BAR_WIDTH = 30


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def bar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `width` cells at most, in eighth-cell steps."""
    if top <= 0 or value <= 0:
        return ""
    eighths = round(value / top * width * 8)
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def _settings_rows(t: Table, r: RunResult | InspectResult) -> None:
    """The model, prompt, budget and taus rows (fields both result types have)."""
    t.add_row("model", f"{r.model} · {r.device} · {r.dtype} · attention {r.attention}")
    doc = f"{r.document_tokens} document tokens"
    if r.document_tokens < r.original_document_tokens:
        doc += f" (middle-truncated from {r.original_document_tokens})"
    t.add_row("prompt", f"{r.prompt_tokens} tokens ({doc})")
    share = min(r.budget / r.prompt_tokens, 1.0)
    policy = (
        (f", decode policy {r.decode_policy}, method {r.method} ({r.allocation} allocation + {r.indicator} indicator)")
        if isinstance(r, RunResult)
        else ""
    )
    t.add_row("budget", f"B = {r.budget} tokens/layer ({share:.1%} of the prompt), window w = {r.window}{policy}")
    t.add_row("taus", f"tau1 = {r.tau1:.3g}, tau2 = {r.tau2:.3g} ({r.tau_rule}); gamma = {r.gamma:g}")


def _grid() -> Table:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    return t


def location_text(loc: Location | None) -> str:
    """'page 3 · characters 7049-7144 of the text (50.6% deep) · similarity 93' or 'not found'."""
    if loc is None:
        return "not found in the document (see the warning)"
    where = f"page {loc.page} · " if loc.page is not None else ""
    return (
        f"{where}characters {loc.start}-{loc.end} ({loc.percent:.1f}% deep) · similarity {loc.similarity:.0f}"
        f' · "{loc.text[:60]}{"…" if len(loc.text) > 60 else ""}"'
    )


def summary_table(r: RunResult) -> Table:
    t = _grid()
    _settings_rows(t, r)
    saved = Text(f"{r.saved_fraction:.1%} saved", style="bold green" if r.evicted else "yellow")
    t.add_row(
        "KV cache",
        Text.assemble(
            f"{human_bytes(r.kv_bytes_full)} full → {human_bytes(r.kv_bytes_kept)} kept after prefill · ",
            saved,
            f" · peak during prefill {human_bytes(r.kv_peak_prefill)} · after decoding {human_bytes(r.kv_bytes_final)}",
        ),
    )
    t.add_row(
        "time",
        f"load {r.load_seconds:.1f} s · prefill {r.prefill_seconds:.2f} s "
        f"(scoring + eviction {r.eviction_seconds:.3f} s) · decode {r.decode_tokens_per_second:.1f} tok/s"
        f" over {r.decode_steps} steps",
    )
    t.add_row("output", f"{r.generated_tokens} tokens, stopped by {r.stop_reason.replace('_', ' ')}")
    if r.task == "needle":
        t.add_row("location", location_text(r.location))
    return t


def layer_table(layers: tuple[LayerResult, ...]) -> Table:
    """Per-layer dispersion, shift, preference share, budget and tokens kept, with a bar chart."""
    t = Table(
        box=box.SIMPLE_HEAD,
        title="allocation across layers",
        title_justify="left",
        caption="H dispersion (nats) · V shift · P preference share · B_l evictable budget · "
        "kept = B_l + w window tokens",
        caption_justify="left",
        pad_edge=False,
    )
    for name in ("layer", "H", "V", "P", "B_l", "kept"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("tokens kept", justify="left", style="magenta", no_wrap=True)
    top = max((layer.kept for layer in layers), default=0)
    for layer in layers:
        t.add_row(
            str(layer.layer),
            "–" if layer.dispersion is None else f"{layer.dispersion:.0f}",
            "–" if layer.shift is None else f"{layer.shift:.1e}",
            "–" if layer.preference_share is None else f"{layer.preference_share:.1%}",
            "all" if layer.budget is None else str(layer.budget),
            str(layer.kept),
            bar(layer.kept, top),
        )
    return t


def render(r: RunResult, console: Console) -> None:
    """Print the full report to `console` (stderr in the CLI)."""
    console.print(Panel(summary_table(r), title=f"CAKE report · {r.task}", title_align="left", border_style="cyan"))
    console.print(layer_table(r.layers))


def inspect_summary(r: InspectResult) -> Table:
    """The inspector's settings, the budget check and memory after prefill."""
    t = _grid()
    t.add_row("document", f"{r.document} (prompt of the {r.template} template)")
    _settings_rows(t, r)
    if r.evicted:
        t.add_row(
            "budgets",
            f"sum of B_l = {r.budget_sum} of (B - w)·L = {r.evictable_total} "
            f"({r.evictable_total - r.budget_sum} lost to integer rounding, at most L = {len(r.layers)})",
        )
    else:
        t.add_row(
            "budgets", Text("the prompt fits the budget: nothing evicted, every layer keeps all tokens", style="yellow")
        )
    t.add_row(
        "KV cache",
        f"{human_bytes(r.kv_bytes_full)} full → {human_bytes(r.kv_bytes_kept)} kept after prefill "
        f"({r.saved_fraction:.1%} saved) · peak during prefill {human_bytes(r.kv_peak_prefill)}",
    )
    t.add_row(
        "time",
        f"load {r.load_seconds:.1f} s · prefill {r.prefill_seconds:.2f} s "
        f"(scoring + eviction {r.eviction_seconds:.3f} s)",
    )
    return t


def render_inspect(r: InspectResult, console: Console) -> None:
    """Print the layer inspector's view (stdout in the CLI: it is the command's answer)."""
    console.print(Panel(inspect_summary(r), title="CAKE layer inspector", title_align="left", border_style="cyan"))
    console.print(layer_table(r.layers))
