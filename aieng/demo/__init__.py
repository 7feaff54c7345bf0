"""The embedded demo model: a small Llama trained from nothing, offline, in minutes on a CPU.

``corpus`` generates checkable tasks and the held-out split, ``tokenizer`` trains byte-level
BPE and owns the chat template, ``model`` defines the architecture, ``train`` is the loop and
``build`` puts it together into a Hugging Face model folder (docs/architecture.md).
"""

from aieng.demo.build import DemoBuildConfig, build_demo_model

__all__ = ["DemoBuildConfig", "build_demo_model"]
