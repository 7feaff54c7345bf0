"""Safe loading: verified hashes, no remote code, a dtype policy and a memory budget before any weight is read."""

from aieng.loading.device import choose_device, choose_dtype
from aieng.loading.loader import LoadedModel, load_folder, load_version
from aieng.loading.memory import MemoryBudget, check_memory_budget

__all__ = [
    "LoadedModel",
    "MemoryBudget",
    "check_memory_budget",
    "choose_device",
    "choose_dtype",
    "load_folder",
    "load_version",
]
