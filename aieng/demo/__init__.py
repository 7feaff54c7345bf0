"""The embedded demo model: a small Llama trained from nothing, offline, in minutes on a CPU.

``corpus`` generates checkable tasks and the held-out split, ``tokenizer`` trains byte-level
BPE and owns the chat template, ``model`` defines the architecture, ``train`` is the loop and
``build`` puts it together into a Hugging Face model folder (docs/architecture.md). ``shapes``
builds untrained stand-ins in real models' layer shapes for benchmarks and tests
(docs/performance.md).

The names below are imported on first use, so that ``aieng demo build --help`` can list the
shapes without importing torch.
"""

__all__ = ["DemoBuildConfig", "build_demo_model", "build_shape_model", "SHAPES"]


def __getattr__(name: str):
    if name in ("DemoBuildConfig", "build_demo_model"):
        from aieng.demo import build

        return getattr(build, name)
    if name in ("build_shape_model", "SHAPES"):
        from aieng.demo import shapes

        return getattr(shapes, name)
    raise AttributeError(f"module 'aieng.demo' has no attribute {name!r}")
