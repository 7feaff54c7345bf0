"""``aieng demo build``: corpus → tokenizer → model → training → a Hugging Face model folder.

Everything is generated here, offline and deterministic in the seed (same seed, same torch
build and thread count → byte-identical model.safetensors). The folder is written under a
temporary name next to ``out_dir`` and renamed into place only when complete
(``aieng.store.staging``), so a crash or Ctrl-C never leaves something that looks like a model.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tokenizers
import torch
import transformers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from aieng.demo.corpus import DEFAULT_MIX, FAMILIES, Example, training_examples
from aieng.demo.heldout_suite import SUITE_FILE as HELDOUT_SUITE_FILE
from aieng.demo.model import ModelDims, generation_config, llama_config, new_model
from aieng.demo.tokenizer import (
    ASSISTANT,
    CHAT_TEMPLATE_VERSION,
    encode_documents,
    render_documents,
    save_tokenizer,
    train_tokenizer,
)
from aieng.demo.train import make_batches, train
from aieng.evaluation.suite_file import SUITE_DIR, SUITE_FILE
from aieng.store.staging import occupied, owned_name, remove_dead, staged_directory

#: Bump when the corpus, tokenizer or training code changes what a given config builds: caches
#: of built models (tests, CI) compare it and rebuild.
RECIPE_VERSION = "demo-recipe-1"
#: Provenance of a build (config, seed, final loss, timings, library versions).
BUILD_INFO_FILE = "demo_build.json"
#: Files every demo build writes (besides BUILD_INFO_FILE).
MODEL_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass(kw_only=True)
class DemoBuildConfig:
    """Every knob of the demo build. The defaults are the shipped demo model.

    The defaults are tuned for a build of a few minutes on 2 CPU cores that still answers every
    corpus family correctly on the held-out split. What a build actually took is measured, not
    promised: ``demo_build.json`` records its training and wall seconds and tokens/s (under CPU
    contention the same build runs several times slower, and tokens/s tells which case it was),
    and ``aieng eval`` records the held-out accuracy in the store's manifest.

    ``dims`` is the network's shape (``model.ModelDims``, whose defaults are the shipped demo's);
    the training knobs live here.
    """

    seed: int = 0
    steps: int = 3000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    #: Upper bound for BPE; the corpus is repetitive, so training stops well below it
    #: (demo_build.json records the vocabulary size reached).
    vocab_size: int = 1024
    #: Examples whose text trains the tokenizer (taken from the start of the training corpus).
    tokenizer_examples: int = 20000
    dims: ModelDims = field(default_factory=ModelDims)
    #: Family weights of the training mix (None: corpus.DEFAULT_MIX).
    mix: dict[str, float] | None = None

    @classmethod
    def tiny(cls, **overrides) -> DemoBuildConfig:
        """A build of seconds for tests and smoke checks: the whole pipeline, no accuracy."""
        values: dict = dict(
            steps=12,
            batch_size=8,
            warmup_steps=2,
            vocab_size=300,
            tokenizer_examples=400,
            dims=ModelDims(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1),
        )
        values.update(overrides)
        return cls(**values)


def _out_dir_taken(out_dir: Path) -> FileExistsError:
    return FileExistsError(f"{out_dir} already exists and is not empty; remove it or choose another --out")


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool):
    """Silence transformers' own bars (e.g. "Writing model shards") when we were asked to."""
    was = hf_logging.is_progress_bar_enabled()
    if not enabled and was:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not hf_logging.is_progress_bar_enabled():
            hf_logging.enable_progress_bar()


def build_demo_model(out_dir: Path, config: DemoBuildConfig, *, progress: bool = True) -> Path:
    """Build the demo model into ``out_dir`` (must not exist, or be empty) and return it.

    Raises ``FileExistsError`` before doing any work if ``out_dir`` holds anything. Writes into
    ``.<name>.building-<host>-<pid>-<random>`` beside ``out_dir`` and renames it at the end; on
    any failure (an exception, Ctrl-C, or SIGTERM) the temporary folder is removed and
    ``out_dir`` is untouched. Temporary folders left by builds that died harder (SIGKILL, power
    loss) on this host are removed by the next build of the same ``out_dir``.
    ``progress`` shows a tqdm bar with step, loss and tokens/s.
    """
    out_dir = Path(out_dir)
    if occupied(out_dir):  # before any work; staged_directory checks again at the rename
        raise _out_dir_taken(out_dir)
    if config.steps < 1 or config.batch_size < 1:
        raise ValueError("steps and batch_size must be positive")
    started = time.perf_counter()
    with staged_build(out_dir) as tmp:
        with _hf_progress_bars(progress):
            info = _build_into(tmp, config, progress=progress)
        info["wall_seconds"] = round(time.perf_counter() - started, 2)
        (tmp / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out_dir


@contextlib.contextmanager
def staged_build(out_dir: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out_dir``; rename it to ``out_dir`` on success.

    The build's half of ``aieng.store.staging``: a temporary name that records host and pid (so
    the next build of ``out_dir`` removes the leftovers of builds that died by SIGKILL), SIGTERM
    turned into an exception so the cleanup runs, and ordinary file permissions at the end.
    Raises ``FileExistsError`` if ``out_dir`` holds anything, before and again at the rename.
    """
    out_dir = Path(out_dir)
    if occupied(out_dir):
        raise _out_dir_taken(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_dead(out_dir.parent, _tmp_prefix(out_dir))
    tmp_name = owned_name(_tmp_prefix(out_dir))
    with _sigterm_raises(), staged_directory(out_dir, tmp_name=tmp_name, exists_error=_out_dir_taken) as tmp:
        yield tmp
        _make_readable(tmp)


def _tmp_prefix(out_dir: Path) -> str:
    return f".{out_dir.name}.building-"


@contextlib.contextmanager
def _sigterm_raises():
    """While building, turn SIGTERM (``kill``, systemd, CI timeouts) into SystemExit.

    Python's default SIGTERM action ends the process without unwinding, which would leave the
    temporary folder behind; raising lets the cleanup run. Only from the main thread and only
    when nobody else installed a handler; the previous handler is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _make_readable(folder: Path) -> None:
    """Give every file ordinary permissions (safetensors writes 0600) so stores can share them."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644 & ~umask)


def demo_tokenizer(
    config: DemoBuildConfig | None = None, examples: Sequence[Example] | None = None
) -> PreTrainedTokenizerFast:
    """The tokenizer a build of ``config`` trains (default: the shipped demo's). Deterministic.

    It learns from the message contents of the first ``config.tokenizer_examples`` training
    examples; the chat template adds the special tokens. ``examples`` is the build's own list;
    when None the full list is generated from the config (all ``steps * batch_size`` of it: the
    corpus draws every family choice before any example, so a shorter list has another prefix).
    """
    config = config or DemoBuildConfig()
    if examples is None:
        examples = training_examples(config.seed, config.steps * config.batch_size, mix=config.mix)
    texts = [t for e in examples[: config.tokenizer_examples] for t in (e.system, e.prompt, e.answer) if t]
    return train_tokenizer(texts, vocab_size=config.vocab_size)


def _build_into(tmp: Path, config: DemoBuildConfig, *, progress: bool) -> dict:
    t0 = time.perf_counter()
    examples = training_examples(config.seed, config.steps * config.batch_size, mix=config.mix)

    tokenizer = demo_tokenizer(config, examples)
    documents = encode_documents(tokenizer, render_documents(tokenizer, examples))
    assistant_id = tokenizer.convert_tokens_to_ids(ASSISTANT)
    answer_starts = [doc.index(assistant_id) + 1 for doc in documents]
    longest = max(len(d) for d in documents)
    if longest > config.dims.context_length:
        raise ValueError(f"a training document has {longest} tokens > context_length {config.dims.context_length}")
    batches = make_batches(
        documents, answer_starts, batch_size=config.batch_size, pad_id=tokenizer.pad_token_id, seed=config.seed
    )
    data_seconds = time.perf_counter() - t0

    ids = {"bos_id": tokenizer.bos_token_id, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id}
    torch.manual_seed(config.seed)
    model = new_model(llama_config(config.dims, vocab_size=len(tokenizer), **ids))
    model.generation_config = generation_config(**ids)
    result = train(
        model,
        batches,
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        min_lr_ratio=config.min_lr_ratio,
        weight_decay=config.weight_decay,
        grad_clip=config.grad_clip,
        progress=progress,
    )

    model.save_pretrained(tmp)
    save_tokenizer(tokenizer, tmp)
    # The held-out suite travels with the model: registering the folder stores it with the version.
    (tmp / SUITE_DIR).mkdir()
    shutil.copyfile(HELDOUT_SUITE_FILE, tmp / SUITE_FILE)
    missing = [name for name in MODEL_FILES if not (tmp / name).is_file()]
    if missing:
        raise RuntimeError(f"save_pretrained did not write {missing}")
    return {
        "recipe": RECIPE_VERSION,
        "config": asdict(config),
        "seed": config.seed,
        "steps": result.steps,
        "families": list(FAMILIES),
        "mix": config.mix or DEFAULT_MIX,
        "final_loss": round(result.final_loss, 4),
        "train_documents": len(documents),
        "train_tokens": result.tokens,
        "train_seconds": round(result.seconds, 2),
        "tokens_per_second": round(result.tokens_per_second, 1),
        "data_seconds": round(data_seconds, 2),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "chat_template_version": CHAT_TEMPLATE_VERSION,
        "torch_threads": torch.get_num_threads(),
        "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """What built a folder (recorded in its build file): weights depend on the torch build."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
