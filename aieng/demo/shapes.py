"""Stand-in models in real models' layer shapes: the demo tokenizer and random weights, no training.

``aieng demo build --shape NAME`` (or :func:`build_shape_model`) writes the same Hugging Face folder
as the trained demo build (config.json, generation_config.json, model.safetensors, tokenizer
files, ``demo_build.json``), in seconds, so it registers, loads, serves and benchmarks like any
model. **It is a performance stand-in: the weights are untrained, its outputs are noise.** Use it
to measure what the layer shapes cost (memory, prefill and decode time, KV cache, grouped-query
attention) and never to judge quality; ``demo_build.json`` says so (``"random_weights": true``)
and ``aieng eval`` of one would only measure chance.

The tokenizer is the demo's, so prompts of the demo task families tokenize exactly as they do
for the trained model (the chat template included). It is produced by training the tokenizer only,
with the shipped demo's recipe (``build.demo_tokenizer()``): that is deterministic, byte-identical
to the trained build's ``tokenizer.json``, takes about two seconds, and needs nothing on disk.
Copying it from a built or stored demo would save those seconds but make the result depend on
which demo a machine happens to hold (an older recipe, another seed); so it is trained once per
process and reused. ``--seed`` seeds the weights only.

Building is atomic like the trained build (``build.staged_build``): a temporary folder beside
``out_dir`` is renamed into place only when complete, and removed on any failure.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aieng.demo.model import ModelDims

#: Bump when the same shape and seed would write different files.
SHAPE_BUILD_VERSION = "shape-build-2"


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A named network shape: its dimensions (context length included) and one line for --help.

    ``vocab_size`` None keeps the demo tokenizer's few hundred tokens. A number is the real model's
    vocabulary: the demo tokenizer is widened to exactly that many tokens (:func:`widen_tokenizer`),
    so the embedding, the output projection over the whole vocabulary, sampling over every logit
    and the tokenizer's own tables cost what they cost on the real model. ``dtype`` is what the
    safetensors hold, as the real checkpoint ships them (a bf16 checkpoint loads, and is
    memory-mapped, as a user's does).
    """

    dims: ModelDims
    about: str
    vocab_size: int | None = None
    dtype: str = "float32"


#: The unit tests' layers: seconds to build and load, and grouped-query (2 query heads per KV head).
TINY_DIMS = ModelDims(
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    context_length=256,
    initializer_range=0.02,
)

#: Every shape ``aieng demo build --shape`` knows.
SHAPES: dict[str, Shape] = {
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M) layer for layer. Two differences, both deliberate:
    # - 2048 positions where the real model has 8192: a KV cache of 32 rows x 8192 positions
    #   does not fit next to the workers on a 24 GB CPU machine, and benchmarks there use short
    #   contexts anyway; 2048 keeps the serving limits meaningful.
    # - the demo tokenizer's few hundred tokens instead of 49152, so about 106M parameters (fp32
    #   about 426 MB) instead of 135M: the embedding and the LM-head matmul are smaller than the
    #   real model's, every transformer layer is the same.
    "smollm2-135m": Shape(
        dims=ModelDims(
            hidden_size=576,
            intermediate_size=1536,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            context_length=2048,
            rope_theta=100000.0,
            initializer_range=0.02,
            tie_word_embeddings=True,
        ),
        about="SmolLM2-135M's 30 layers: hidden 576, 9 heads / 3 KV heads, MLP 1536; 2048 positions; "
        "about 106M parameters with the demo vocabulary",
    ),
    # Qwen2.5-0.5B (Qwen/Qwen2.5-0.5B-Instruct) in the Llama layout: same layer count, widths,
    # heads, tied embeddings and full vocabulary; the real model's q/k/v biases (896 + 2 x 128 numbers
    # per layer) are left out, which changes nothing a benchmark sees. 4096 positions of its 32768:
    # a KV cache of 32 rows x 4096 positions in bf16 already takes 1.5 GiB.
    "qwen2.5-0.5b": Shape(
        dims=ModelDims(
            hidden_size=896,
            intermediate_size=4864,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            context_length=4096,
            rope_theta=1000000.0,
            initializer_range=0.02,
            tie_word_embeddings=True,
        ),
        about="Qwen2.5-0.5B's 24 layers: hidden 896, 14 heads / 2 KV heads, MLP 4864, tied embeddings, "
        "its full 151,936-token vocabulary (the demo tokenizer widened); 4096 positions; 494M "
        "parameters, bf16",
        vocab_size=151936,
        dtype="bfloat16",
    ),
    # Llama-3.2-1B (meta-llama/Llama-3.2-1B-Instruct): 16 layers, hidden 2048, 32 heads / 8 KV heads,
    # MLP 8192, tied embeddings, 128,256 tokens. Its llama3 RoPE frequency scaling only changes
    # positions past the original 8192, which 4096 positions never reach.
    "llama-3.2-1b": Shape(
        dims=ModelDims(
            hidden_size=2048,
            intermediate_size=8192,
            num_layers=16,
            num_heads=32,
            num_kv_heads=8,
            context_length=4096,
            rope_theta=500000.0,
            initializer_range=0.02,
            tie_word_embeddings=True,
        ),
        about="Llama-3.2-1B's 16 layers: hidden 2048, 32 heads / 8 KV heads, MLP 8192, tied embeddings, "
        "its full 128,256-token vocabulary (the demo tokenizer widened); 4096 positions; 1.24B "
        "parameters, bf16",
        vocab_size=128256,
        dtype="bfloat16",
    ),
    # For unit tests: seconds to build and load, and grouped-query (2 query heads per KV head).
    "tiny": Shape(
        dims=TINY_DIMS,
        about="2 layers, hidden 64, 4 heads / 2 KV heads so grouped-query attention runs, MLP 128; "
        "256 positions; for unit tests",
    ),
    # For unit tests of a widened vocabulary: the tiny layers with a vocabulary many times the demo's.
    "tiny-wide-vocab": Shape(
        dims=TINY_DIMS,
        about="the tiny shape with an 8192-token vocabulary (the demo tokenizer widened) in bf16; for unit tests",
        vocab_size=8192,
        dtype="bfloat16",
    ),
}


class UnknownShapeError(ValueError):
    def __init__(self, name: str):
        super().__init__(f"unknown shape {name!r}; choose from: {', '.join(SHAPES)}")


def shape_dims(name: str) -> ModelDims:
    """The dimensions of shape ``name``; ``UnknownShapeError`` lists the choices."""
    if name not in SHAPES:
        raise UnknownShapeError(name)
    return SHAPES[name].dims


def count_parameters(dims: ModelDims, vocab_size: int) -> int:
    """Parameters of a model of ``dims`` (tied weights counted once), with no weight allocated."""
    import torch

    from aieng.demo.model import llama_config, new_model

    with torch.device("meta"):
        model = new_model(llama_config(dims, vocab_size=vocab_size, bos_id=1, eos_id=2, pad_id=0))
    return sum(p.numel() for p in model.parameters())


def build_shape_model(out_dir: Path | str, shape: str, *, seed: int = 0, progress: bool = False) -> Path:
    """Write shape ``shape`` with random weights seeded by ``seed`` into ``out_dir`` and return it.

    ``out_dir`` must not exist or be empty (``FileExistsError`` otherwise); an unknown shape raises
    ``UnknownShapeError``; in both cases before anything is written. Same shape, seed, torch build
    → byte-identical files. ``progress`` prints each step and its time on stderr.
    """
    dims = shape_dims(shape)
    spec = SHAPES[shape]
    out_dir = Path(out_dir)
    say = _Progress(progress)
    started = time.perf_counter()
    say.line(f"building shape {shape!r} (random weights, seed {seed}) into {out_dir}")
    with say.step("imports", "importing torch and transformers"):
        import torch

        from aieng.demo.build import (
            BUILD_INFO_FILE,
            MODEL_FILES,
            RECIPE_VERSION,
            _hf_progress_bars,
            library_versions,
            staged_build,
        )
        from aieng.demo.model import generation_config, llama_config, new_model
        from aieng.demo.tokenizer import CHAT_TEMPLATE_VERSION, save_tokenizer

    dtype = getattr(torch, spec.dtype)
    with staged_build(out_dir) as tmp:
        with say.step("tokenizer", "training the demo tokenizer (the shipped demo's recipe, deterministic)"):
            tokenizer = _demo_tokenizer(spec.vocab_size)
            tokenizer.model_max_length = dims.context_length  # the tokenization itself is the demo's
        ids = {"bos_id": tokenizer.bos_token_id, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id}
        config = llama_config(dims, vocab_size=len(tokenizer), **ids)
        config.dtype = spec.dtype  # config.json says what the safetensors hold
        initialising = (
            f"initialising random weights ({dims.num_layers} layers, hidden {dims.hidden_size}, {spec.dtype})"
        )
        with say.step("weights", initialising):
            with torch.random.fork_rng(devices=[]), _default_dtype(torch, dtype):  # the caller's RNG untouched
                torch.manual_seed(seed)
                model = new_model(config)
            model.generation_config = generation_config(**ids)
            num_parameters = sum(p.numel() for p in model.parameters())
        size_mb = num_parameters * dtype.itemsize / 1e6
        saving = f"writing {num_parameters / 1e6:.1f}M parameters ({spec.dtype}, {size_mb:.1f} MB) and the tokenizer"
        with say.step("save", saving):
            with _hf_progress_bars(False):  # its one-shard bar would break our line
                model.save_pretrained(tmp, max_shard_size="100GB")  # one file, as the smaller shapes
            save_tokenizer(tokenizer, tmp)
        missing = [name for name in MODEL_FILES if not (tmp / name).is_file()]
        if missing:
            raise RuntimeError(f"save_pretrained did not write {missing}")
        info = {
            "shape": shape,
            "random_weights": True,
            "note": "performance stand-in: untrained random weights, outputs are noise",
            "shape_build": SHAPE_BUILD_VERSION,
            "dims": asdict(dims),
            "seed": seed,
            "num_parameters": num_parameters,
            "vocab_size": len(tokenizer),
            "demo_tokens": len(_demo_tokenizer()),
            "dtype": spec.dtype,
            "tokenizer_recipe": RECIPE_VERSION,
            "chat_template_version": CHAT_TEMPLATE_VERSION,
            "seconds": say.seconds,
            "wall_seconds": round(time.perf_counter() - started, 2),
            "versions": library_versions(),
        }
        (tmp / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    say.line(f"done in {time.perf_counter() - started:.1f} s")
    return out_dir


def _demo_tokenizer(vocab_size: int | None = None):
    """A fresh copy of the shipped demo tokenizer (trained once per process, then rebuilt from JSON),
    widened to ``vocab_size`` tokens when given."""
    from tokenizers import Tokenizer

    from aieng.demo.tokenizer import wrap_tokenizer

    text = _demo_tokenizer_json()
    if vocab_size is not None:
        text = widen_tokenizer(text, vocab_size)
    return wrap_tokenizer(Tokenizer.from_str(text))


#: Filler tokens are this prefix and their id: "Ġ" is byte-level BPE's space, so one decodes to
#: " w123456". Encoding never yields one: the demo pre-tokenizer splits digits one per token.
FILLER_PREFIX = "Ġw"


def widen_tokenizer(tokenizer_json: str, vocab_size: int) -> str:
    """The demo tokenizer's JSON with its BPE vocabulary filled up to ``vocab_size`` tokens.

    The demo's tokens keep their ids (0..n-1), so every text tokenizes exactly as before; ids n up
    to ``vocab_size``-1 are filler tokens that no merge produces and that decode to readable text.
    This is "the demo tokenizer mapped into the larger vocabulary": a random-weight model samples
    anywhere in the full vocabulary, as a real one can, and every id it samples decodes.
    """
    spec = json.loads(tokenizer_json)
    vocab: dict[str, int] = spec["model"]["vocab"]
    have = max(vocab.values()) + 1
    if vocab_size < have:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the demo tokenizer's {have} tokens")
    for token_id in range(have, vocab_size):
        token = f"{FILLER_PREFIX}{token_id}"
        if token in vocab:
            raise ValueError(f"filler token {token!r} is already in the demo vocabulary")
        vocab[token] = token_id
    return json.dumps(spec, ensure_ascii=False)


@contextlib.contextmanager
def _default_dtype(torch, dtype):
    """Parameters created inside are ``dtype`` (a bf16 shape never holds an fp32 copy of itself)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@functools.lru_cache(maxsize=1)
def _demo_tokenizer_json() -> str:
    from aieng.demo.build import demo_tokenizer

    return demo_tokenizer().backend_tokenizer.to_str()


class _Progress:
    """One line per step on stderr, with its time; silent when disabled. Keeps the times."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seconds: dict[str, float] = {}

    def line(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def step(self, key: str, text: str):
        if self.enabled:
            print(f"  {text} ...", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.seconds[key] = round(time.perf_counter() - t0, 2)
            if self.enabled:
                print(f" {self.seconds[key]:.1f} s" if ok else " failed", file=sys.stderr, flush=True)
