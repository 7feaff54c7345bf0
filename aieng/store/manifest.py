"""``manifest.json``: a version's identity, provenance, integrity hashes and measured quality.

Fields: docs/architecture.md's manifest table. Unknown keys found on disk are kept (``extra``) so an
older aieng never drops what a newer one wrote.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from aieng.store.hashing import MANIFEST_NAME
from aieng.store.staging import owned_name

STATUSES = ("candidate", "stable", "retired")


@dataclass
class Manifest:
    name: str
    version: str
    created_at: str
    source: str
    files: dict[str, str]  # relative path -> sha256, every file of the version except this manifest
    format: str = "safetensors"
    architecture: str = ""
    num_parameters: int = 0
    dtype: str = ""
    context_length: int | None = None
    hardware_profile: dict = field(default_factory=dict)
    dependencies: dict = field(default_factory=dict)
    eval: dict | None = None  # {"suite", "metrics": {...}, "measured_at"} from `aieng eval`
    performance_baseline: dict | None = None  # from `aieng bench serve`
    prompt_template: dict | None = None  # {"sha256", "source", "version"} of the chat template
    release_gate: dict | None = None  # the gate's decision, thresholds, who and why, at promotion
    suite: dict | None = None  # the eval suite stored with the version: name, sha256, file, thresholds
    comparison: dict | None = None  # answers compared with another version's (`aieng eval --compare`)
    served_answers: dict | None = None  # its probe answers as served (`aieng.release.served_answers`)
    status: str = "candidate"
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        extra = data.pop("extra")
        return {**extra, **data}

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )

    @classmethod
    def read(cls, version_dir: Path) -> Manifest:
        return cls.from_dict(json.loads((version_dir / MANIFEST_NAME).read_text()))

    def write(self, version_dir: Path) -> None:
        """Write atomically: a reader sees the old manifest or the new one, never half of one.

        The temporary file sits beside the version folder, not in it: a process killed between
        the write and the rename would otherwise leave a file that ``verify`` reports as extra.
        The store removes such leftovers once their process is gone (``MANIFEST_TMP_PREFIX``)."""
        write_json_atomic(
            version_dir / MANIFEST_NAME, self.to_dict(), tmp=Path(version_dir).parent / owned_name(MANIFEST_TMP_PREFIX)
        )


MANIFEST_TMP_PREFIX = ".manifest-writing-"


def write_json_atomic(path: Path, data: dict, *, tmp: Path | None = None) -> None:
    """Write JSON to ``tmp`` (default: a pid-named file beside ``path``), fsync, rename over ``path``."""
    tmp = tmp or path.with_name(owned_name(f".{path.name}.tmp-"))
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
