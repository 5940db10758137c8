"""OpenVINO GenAI's rows in `cake bench speed --openvino`: the CPU runtime that has KV-cache
eviction built in, beside cake-cli on the same checkpoint, document, threads and token count.

It runs in its own virtual environment (`.venv-openvino`, made by benchmarks/openvino_env.sh:
optimum-intel, which exports the checkpoint to OpenVINO IR, pins transformers < 5.6), through
benchmarks/openvino_speed.py: once with its full cache ("openvino-full") and once with its eviction
(`CacheEvictionConfig`: start and recent tokens = the observation window w, at most the budget B
held, "openvino-evict"), each after one warm-up generation and `repeats` timed ones, as our rows.
The IR (int8 weights, as `--weights int8` for cake-cli) is exported once into ``models_dir()/openvino``.
"""

from __future__ import annotations

from pathlib import Path

from cake_cli.bench.speed.paths import REPO, external_row, run_json_script
from cake_cli.bench.speed.rows import OPENVINO_METHODS, WARMUP_NEW_TOKENS, WARMUP_TOKENS, SpeedRow
from cake_cli.errors import CakeError
from cake_cli.paths import models_dir

OPENVINO_PYTHON = REPO / ".venv-openvino" / "bin" / "python"
OPENVINO_SCRIPT = REPO / "benchmarks" / "openvino_speed.py"


def available() -> bool:
    """Whether .venv-openvino and the runner script exist (a source checkout with the venv made)."""
    return OPENVINO_PYTHON.is_file() and OPENVINO_SCRIPT.is_file()


def ir_folder(model_dir: Path) -> Path:
    """Where the OpenVINO IR export of checkpoint folder `model_dir` is kept."""
    return models_dir() / "openvino" / f"{model_dir.resolve().name}-int8"


def require() -> None:
    """Raise unless OpenVINO GenAI's venv is set up.

    Raises:
        CakeError: the venv is missing, with the command that makes it.
    """
    if not available():
        raise CakeError(
            "OpenVINO GenAI is not set up", "run `bash benchmarks/openvino_env.sh` (it makes .venv-openvino)"
        )


def openvino_rows(
    model_dir: Path,
    token_ids: list[int],
    budget: int,
    window: int,
    group: str,
    *,
    new_tokens: int,
    threads: tuple,
    repeats: int = 3,
) -> list[SpeedRow]:
    """OpenVINO GenAI's full-cache and eviction rows on `token_ids` (see the module docstring).

    Args:
        model_dir: the converted checkpoint folder cake-cli loads (exported to IR once).
        budget, window: B and w of cake-cli's rows (OpenVINO's max_cache_size and start/recent sizes).
        threads: (prefill, decode) threads; OpenVINO takes one count, the prefill one.

    Raises:
        CakeError: the venv is missing (with the command that makes it) or the run failed.
    """
    require()
    args = {
        "--model-dir": model_dir,
        "--ir-dir": ir_folder(model_dir),
        "--budget": budget,
        "--window": window,
        "--new-tokens": new_tokens,
        "--threads": threads[0],
        "--repeats": repeats,
        "--warmup-tokens": WARMUP_TOKENS,
        "--warmup-new-tokens": WARMUP_NEW_TOKENS,
    }
    fix = "check .venv-openvino (bash benchmarks/openvino_env.sh)"
    data = run_json_script(OPENVINO_PYTHON, OPENVINO_SCRIPT, token_ids, args, "the OpenVINO GenAI run", fix)
    return [
        external_row(row, method, row["budget"], group, (threads[0], threads[0]))
        for row, method in zip(data["rows"], OPENVINO_METHODS)
    ]
