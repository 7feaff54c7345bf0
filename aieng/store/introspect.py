"""Read what the store and the loader need from a Hugging Face model folder, without loading weights.

Everything here reads JSON and safetensors headers only, so registering a multi-GB model costs
one hashing pass, not a load.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from aieng.errors import StoreError
from aieng.model_facts import context_length

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

# bytes per element for the dtypes safetensors headers carry
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I8": "int8",
    "U8": "uint8",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    model_type: str
    num_parameters: int
    dtype: str
    context_length: int | None
    weight_files: tuple[str, ...]
    prompt_template: dict | None  # {"sha256": ..., "source": file} of the chat template, if any
    serving: str  # the forward that serves it: native | transformers (serving_path)


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise StoreError(f"{folder} has no config.json: it is not a Hugging Face model folder")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON: {exc}") from exc


def needs_remote_code(config: dict) -> bool:
    """A config that names its own Python classes (``auto_map``) or an architecture transformers lacks."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return "auto_map" in config or config.get("model_type") not in CONFIG_MAPPING_NAMES


def check_causal_lm(config: dict, folder: Path) -> str:
    """Return the causal-LM architecture name, or raise saying why the folder is refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if needs_remote_code(config):
        raise StoreError(
            f"{folder} needs custom Python code (model_type={model_type!r}"
            f"{', auto_map present' if 'auto_map' in config else ''}); aieng never runs trust_remote_code: "
            "use a model whose architecture transformers ships (Llama, Qwen2, Mistral, ...)"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise StoreError(
            f"{folder} is a {model_type!r} model, not a causal language model; aieng serves text generation only"
        )
    archs = config.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    causal = [a for a in archs if a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))]
    if not causal:
        raise StoreError(f"{folder} declares architectures {archs}, none of which is a causal LM head")
    return causal[0]


def check_servable(config: dict, folder: Path) -> str:
    """How the engine will serve the model (``serving_path``'s kind), or raise saying why it never
    will: decided from config.json alone, so a refused model is refused before anything is copied."""
    from transformers import CONFIG_MAPPING

    from aieng.engine.serving_path import serving_path

    try:
        parsed = CONFIG_MAPPING[config["model_type"]].from_dict(config)
    except Exception as exc:  # transformers validates configs with its own error types
        raise StoreError(f"{folder / 'config.json'} is not a valid {config['model_type']!r} config: {exc}") from exc
    path = serving_path(parsed)
    if path.refused:
        raise StoreError(
            f"{folder} cannot be served exactly, so it is not registered: {path.reason}", code="unsupported_model"
        )
    return path.kind


def find_pickle_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.suffix in PICKLE_SUFFIXES)


def weight_facts(folder: Path) -> tuple[tuple[str, ...], int, str]:
    """(safetensors files, parameter count, dominant dtype) from the safetensors headers."""
    files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")))
    if not files:
        raise StoreError(f"{folder} has no .safetensors weights")
    total = 0
    by_dtype: Counter[str] = Counter()
    for rel in files:
        try:
            with safe_open(str(folder / rel), framework="pt") as handle:
                for key in handle.keys():
                    tensor_slice = handle.get_slice(key)
                    numel = 1
                    for dim in tensor_slice.get_shape():
                        numel *= dim
                    total += numel
                    by_dtype[tensor_slice.get_dtype()] += numel
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise StoreError(f"{folder / rel} is not a readable safetensors file: {exc}") from exc
    dtype = (
        _DTYPE_NAMES.get(by_dtype.most_common(1)[0][0], by_dtype.most_common(1)[0][0].lower())
        if by_dtype
        else "unknown"
    )
    return files, total, dtype


def prompt_template(folder: Path) -> dict | None:
    """The chat template a version ships, hashed so an eval result is tied to the exact template."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        text, source = jinja.read_text(), "chat_template.jinja"
    else:
        cfg = folder / "tokenizer_config.json"
        if not cfg.is_file():
            return None
        template = json.loads(cfg.read_text()).get("chat_template")
        if not template:
            return None
        text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
        source = "tokenizer_config.json"
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "source": source}


def inspect_folder(folder: Path) -> ModelFacts:
    """Everything register needs, refusing pickle weights, folders that are not causal LMs and
    configurations no forward serves exactly."""
    if not folder.is_dir():
        raise StoreError(f"{folder} is not a directory")
    pickles = find_pickle_files(folder)
    if pickles:
        raise StoreError(
            f"{folder} contains pickle weights ({', '.join(pickles)}): pickle can run arbitrary code when loaded. "
            f"Convert them first: aieng model convert {folder} --out <new folder>"
        )
    config = read_config(folder)
    architecture = check_causal_lm(config, folder)
    serving = check_servable(config, folder)
    files, params, dtype = weight_facts(folder)
    return ModelFacts(
        architecture=architecture,
        model_type=config.get("model_type", "unknown"),
        num_parameters=params,
        dtype=dtype,
        context_length=context_length(config),
        weight_files=files,
        prompt_template=prompt_template(folder),
        serving=serving,
    )
