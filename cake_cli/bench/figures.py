"""matplotlib for the benchmark plots: the optional import and the atomic PNG write they share."""

from __future__ import annotations

import io
from pathlib import Path

from cake_cli.errors import CakeError
from cake_cli.files import write_atomic


def pyplot():
    """`matplotlib.pyplot` on the Agg backend.

    Raises:
        CakeError: matplotlib is not installed (with the install command).
    """
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency (the `bench` extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise CakeError(
            "the plot needs matplotlib",
            "install it with `pip install matplotlib` (or `pip install -e '.[bench]'`), or leave out --plot",
        ) from None
    return plt


def save_png(plt, fig, path: Path, option: str, **savefig) -> None:
    """Render `fig` to PNG in memory, close it, and write it to `path` atomically (`option` names
    the option that chose the path, for a write error)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    plt.close(fig)
    write_atomic(path, buffer.getvalue(), option)
