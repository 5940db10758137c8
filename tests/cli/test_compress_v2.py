"""`cake compress --kv-bits` and the .cake format v2 through the real CLI on the tiny random profile: a
quantized file answers exactly as the same cache quantized in process, the report gives the bytes on
disk and in memory next to the full cache's, version 1 files still load, and bad input (bits, damaged
scales, a newer format) is one line with the right exit code and nothing written."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import yaml
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cake_cli.tasks.saved import fileformat as cachefile
from cake_cli.tasks.saved import store
from cake_cli.tasks.saved.fileformat import FORMAT_VERSION
from tests.helpers.cli import TINY, invoke, one_error_line
from tests.helpers.cli import compressed as compress_tiny

QUESTIONS = ["Who holds the copyright?", "What does the license permit?"]


def compressed(doc, path, *args):
    """A question-agnostic .cake (`--scoring end`: evicted at compression, so the file holds B·L tokens)."""
    return compress_tiny(doc, path, "--scoring", "end", *args)


@pytest.fixture
def four(doc, cli_env):
    return compressed(doc, cli_env / "four.cake", "--kv-bits", "4")


def meta_of(blob: bytes) -> tuple[dict, int]:
    size = int.from_bytes(blob[:8], "little")
    return json.loads(json.loads(blob[8 : 8 + size])["__metadata__"]["cake_cli"]), size


def rewritten(path, target, tensors=None, drop=(), **changes) -> None:
    """A copy of a .cake with metadata (and tensors) changed, its checksum made valid again (version 3's
    over the whole file, and the data-only one versions 1-2 record)."""
    blob = path.read_bytes()
    meta, _ = meta_of(blob)
    meta.update(changes)
    for name in drop:
        meta.pop(name)
    tensors = tensors if tensors is not None else load_tensors(blob)
    unsigned = save_tensors(tensors, metadata={"cake_cli": json.dumps(meta)})
    header, start = cachefile.split_file(unsigned, target)
    meta["data_sha256"] = hashlib.sha256(unsigned[start:]).hexdigest()
    meta["sha256"] = cachefile.file_sha256(header, meta, unsigned[start:])
    target.write_bytes(save_tensors(tensors, metadata={"cake_cli": json.dumps(meta)}))


def test_quantized_files_are_smaller_and_say_so(four, doc, cli_env):
    path, report = four
    _, sixteen = compressed(doc, cli_env / "sixteen.cake")
    _, eight = compressed(doc, cli_env / "eight.cake", "--kv-bits", "8")
    meta = cachefile.read_saved(path).meta
    assert meta.format_version == FORMAT_VERSION and (meta.kv_bits, meta.kv_group, meta.kv_recent) == (4, 32, 8)
    assert (meta.kv_value_group, meta.kv_rotation) == (8, "hadamard"), (
        "format 6: rotated values, a group a head (d = 8)"
    )
    assert (report["kv_bits"], report["kv_group"], sixteen["kv_bits"], sixteen["kv_group"]) == (4, 32, 16, None)
    assert sixteen["kv_bytes_file"] == sixteen["kv_bytes_kept"] == report["kv_bytes_kept"], "same tokens, 16 bits"
    assert report["kv_bytes_file"] < eight["kv_bytes_file"] < sixteen["kv_bytes_file"]
    assert report["file_bytes"] < eight["file_bytes"] < sixteen["file_bytes"]
    assert report["file_fraction"] == pytest.approx(report["file_bytes"] / report["kv_bytes_full"])
    text = invoke("compress", doc, "-o", cli_env / "t.cake", *TINY, "-b", "64", "--scoring", "end", "--kv-bits", "4")
    assert text.exit_code == 0 and text.stdout == ""
    assert "4 bits, key groups of 32 tokens, Hadamard-rotated value groups of 8 channels" in text.stderr
    assert "a loaded file keeps" in text.stderr and "global layers quantized" in text.stderr
    assert "on disk" in text.stderr and "full cache" in text.stderr


def test_without_kv_bits_the_file_takes_the_profiles_bits_and_says_why(doc, cli_env, tiny_profile_dir, monkeypatch):
    spec = yaml.safe_load((tiny_profile_dir / "tiny-test.yaml").read_text())
    spec.update(name="tiny-four", kv_bits=4, kv_bits_source="measured on 460 questions")
    other = cli_env / "profiles"
    other.mkdir()
    (other / "tiny-four.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("CAKE_PROFILES_DIR", os.pathsep.join([str(tiny_profile_dir), str(other)]))
    args = ["-b", "64", "--dtype", "float32", "--scoring", "end"]
    four = invoke("compress", doc, "-o", cli_env / "p4.cake", "-m", "tiny-four", *args, "--json")
    assert four.exit_code == 0, four.stderr
    report = json.loads(four.stdout)
    assert report["kv_bits"] == cachefile.read_saved(cli_env / "p4.cake").meta.kv_bits == 4
    assert report["kv_bits_reason"] == "the tiny-four profile's default: measured on 460 questions"
    forced = invoke("compress", doc, "-o", cli_env / "p16.cake", "-m", "tiny-four", *args, "--kv-bits", "16", "--json")
    assert (json.loads(forced.stdout)["kv_bits"], json.loads(forced.stdout)["kv_bits_reason"]) == (16, "--kv-bits")
    plain = invoke("compress", doc, "-o", cli_env / "t16.cake", *TINY, *args)
    assert plain.exit_code == 0 and cachefile.read_saved(cli_env / "t16.cake").meta.kv_bits == 16
    assert "kv bits" in plain.stderr and "16: the tiny-test profile's default" in plain.stderr
    text = invoke("compress", doc, "-o", cli_env / "t4.cake", "-m", "tiny-four", *args)
    assert "4: the tiny-four profile's default: measured on 460" in " ".join(text.stderr.split())


def test_4bit_file_answers_as_the_cache_quantized_in_process(four, doc):
    path, _ = four
    piped = "\n".join(QUESTIONS) + "\n"
    # the chat's in-process compression held at 4 bits in memory (engine.kvmemory), as the file is once loaded
    chat = invoke("chat", doc, *TINY, "-b", "64", "--dtype", "fp32", "--scoring", "end", "--kv-bits", "4", "-n", "8",
                  "--json", input=piped)  # fmt: skip
    assert chat.exit_code == 0, chat.stderr
    for turn in map(json.loads, chat.stdout.splitlines()):
        qa = invoke("qa", path, turn["question"], "-n", "8", "--json")
        assert qa.exit_code == 0, qa.stderr
        got = json.loads(qa.stdout)
        assert got["answer"] == turn["answer"] and got["generated_tokens"] == turn["generated_tokens"] > 0
        assert got["cache"]["kv_bytes"] == turn["cache"]["kv_bytes"]


def test_format_5_headers_read_as_unrotated_value_groups_of_the_key_group(four):
    """A version 1-5 header has no kv_value_group or kv_rotation: its values are read as format 5 wrote them."""
    path, _ = four
    meta, _ = meta_of(path.read_bytes())
    for name in ("kv_value_group", "kv_rotation"):
        meta.pop(name)
    old = cachefile.CacheMeta.from_json(dict(meta, format_version=5))
    assert old.value_coding() == {"value_group": 32, "rotated": False}
    assert cachefile.CacheMeta.from_json(meta_of(path.read_bytes())[0]).value_coding() == {
        "value_group": 8,
        "rotated": True,
    }


def test_version_1_files_still_load(doc, cli_env):
    path, _ = compressed(doc, cli_env / "v2.cake")
    rewritten(path, cli_env / "v1.cake", format_version=1, drop=cachefile.V2_DEFAULTS)
    assert cachefile.read_saved(cli_env / "v1.cake").meta.kv_bits == 16
    answers = [
        json.loads(invoke("qa", p, QUESTIONS[0], "-n", "6", "--json").stdout) for p in (path, cli_env / "v1.cake")
    ]
    assert answers[0]["answer"] == answers[1]["answer"]


def test_bad_kv_bits(doc, cli_env, four):
    out = cli_env / "three.cake"
    line = one_error_line(invoke("compress", doc, "-o", out, *TINY, "--kv-bits", "3"), 2, "--kv-bits 3")
    assert "16, 8, 4" in line and not out.exists()
    one_error_line(invoke("chat", doc, *TINY, "--kv-bits", "3", input="?\n"), 2, "--kv-bits 3")
    line = one_error_line(invoke("chat", four[0], "--kv-bits", "8", input="?\n"), 2, "keeps the bits it was saved with")


def test_damaged_scales(four, cli_env):
    path, _ = four
    out = cli_env / "answer.txt"
    blob = bytearray(path.read_bytes())
    tensors = load_tensors(bytes(blob))
    _, size = meta_of(bytes(blob))
    header = json.loads(blob[8 : 8 + size])
    start = 8 + size + header["keys.1.scale"]["data_offsets"][0]
    blob[start + 1] ^= 0x7F  # a flipped byte inside a scale: the checksum catches it
    (cli_env / "flipped.cake").write_bytes(bytes(blob))
    one_error_line(invoke("qa", cli_env / "flipped.cake", "Who?", "-o", out), 1, "checksum")
    tensors["keys.1.scale"][0, 0, 0] = float("nan")  # damaged, the checksum made valid again
    rewritten(path, cli_env / "nan.cake", tensors)
    line = one_error_line(invoke("qa", cli_env / "nan.cake", "Who?", "-o", out, "--quiet"), 1, "damaged")
    assert "layer 1" in line and "cake compress" in line
    tensors["keys.1.scale"][0, 0, 0] = 0.0
    rewritten(path, cli_env / "zero.cake", tensors)
    one_error_line(invoke("qa", cli_env / "zero.cake", "Who?", "-o", out, "--quiet"), 1, "damaged")
    rewritten(path, cli_env / "bits.cake", kv_bits=3)
    one_error_line(invoke("qa", cli_env / "bits.cake", "Who?", "-o", out), 1, "quantization settings")
    for name, changes in (
        ("spin", {"kv_rotation": "givens"}),
        ("old", {"format_version": 5}),
        ("vg", {"kv_value_group": 0}),
        ("odd", {"kv_value_group": 6}),
    ):
        # a rotation format 5 did not have, unknown ones, or a rotated group that is not one Hadamard block
        rewritten(path, cli_env / f"{name}.cake", **changes)
        line = one_error_line(invoke("qa", cli_env / f"{name}.cake", "Who?", "-o", out), 1, "quantization settings")
        assert "rotation" in line and "cake compress" in line
    assert not out.exists(), "nothing written"


def test_a_newer_format_is_refused(four, cli_env):
    path, _ = four
    rewritten(path, cli_env / "v4.cake", format_version=FORMAT_VERSION + 1, cake_cli_version="9.0")
    line = one_error_line(invoke("qa", cli_env / "v4.cake", "Who?"), 1, f"format version {FORMAT_VERSION + 1}")
    assert "newer than this cake-cli reads" in line and "upgrade cake-cli" in line and "cake compress" in line


def test_2bit_file_end_to_end(four, doc, cli_env):
    """`cake compress --kv-bits 2` (format 5: four codes a byte, the first tokens exact) on the default scoring (the
    prefix kept whole): a smaller file than 4 bits that answers as the same cache held at 2 bits in process."""
    path, report = compress_tiny(doc, cli_env / "two.cake", "--kv-bits", "2")
    meta = cachefile.read_saved(path).meta
    assert (meta.format_version, meta.kv_bits, meta.kv_group, meta.kv_sink) == (FORMAT_VERSION, 2, 32, 4) and meta.whole
    assert report["kv_bits"] == 2 and report["kv_bytes_file"] < report["kv_bytes_kept"] * 0.5
    tensors = load_tensors(path.read_bytes())
    assert tensors["keys.0.sink"].shape[1] == 4 and tensors["keys.0.codes"].shape[-1] == -(
        -tensors["keys.0.sink"].shape[-1] // 4
    )
    four_whole, _ = compress_tiny(doc, cli_env / "four-whole.cake", "--kv-bits", "4")
    assert path.stat().st_size < four_whole.stat().st_size
    chat = invoke("chat", doc, *TINY, "-b", "64", "--dtype", "fp32", "--kv-bits", "2", "-n", "8", "--json",
                  input=QUESTIONS[0] + "\n")  # fmt: skip
    assert chat.exit_code == 0, chat.stderr
    turn = json.loads(chat.stdout.splitlines()[0])
    qa = invoke("qa", path, QUESTIONS[0], "-n", "8", "--json")
    assert qa.exit_code == 0, qa.stderr
    assert json.loads(qa.stdout)["answer"] == turn["answer"]


def test_version_4_and_5_quantized_files_still_load(doc, cli_env, monkeypatch):
    """4-bit files as cake-cli wrote them before format 6 (values unrotated in groups of 32) and before format 5
    (no `kv_sink`, no `.sink` parts) load and answer as the same file read with this version's fields; a 2-bit
    file claiming version 4 is refused (2 bits came with version 5)."""
    monkeypatch.setattr(store, "DEFAULT_KV_SINK", 0)  # the layout of format 4
    monkeypatch.setattr(store, "value_coding_of", lambda cache: {"value_group": 32, "rotated": False})  # format 5
    path, _ = compressed(doc, cli_env / "v6.cake", "--kv-bits", "4")
    assert not any(name.endswith(".sink") for name in load_tensors(path.read_bytes()))
    rewritten(path, cli_env / "v5.cake", format_version=5, drop=("kv_value_group", "kv_rotation"))
    rewritten(path, cli_env / "v4.cake", format_version=4, drop=("kv_sink", "kv_value_group", "kv_rotation"))
    assert cachefile.read_saved(cli_env / "v4.cake").meta.kv_sink == 0
    for old in ("v5", "v4"):
        assert cachefile.read_saved(cli_env / f"{old}.cake").meta.value_coding() == {
            "value_group": 32,
            "rotated": False,
        }
    answers = [
        json.loads(invoke("qa", p, QUESTIONS[0], "-n", "6", "--json").stdout)
        for p in (path, cli_env / "v5.cake", cli_env / "v4.cake")
    ]
    assert answers[0]["answer"] == answers[1]["answer"] == answers[2]["answer"]
    rewritten(path, cli_env / "two-v4.cake", format_version=4, kv_bits=2)
    one_error_line(invoke("qa", cli_env / "two-v4.cake", "Who?"), 1, "quantization settings")
