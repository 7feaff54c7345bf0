"""Eval suites as files the user owns: read, check and hash one (format ``aieng-suite/1``).

A suite is a YAML (or JSON) file of cases, each a prompt or chat messages with sampling settings
and assertions, grouped in named families with weights; plus the thresholds its release gate
applies and an optional text whose perplexity is measured. The format is defined by
``suite.schema.json`` beside this module (docs/evaluation.md explains it); every file is checked
against it when read, so a typo is a clear error naming the place, never a case that silently
passes. The suite's hash covers its content (the parsed document, not its comments or layout) and
its perplexity text's bytes: two results are comparable only when measured with the same hash,
and a copy stored with a model version (``eval-suite/`` in the version folder) hashes the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from aieng.engine.params import GREEDY_BELOW
from aieng.errors import SuiteError
from aieng.user_hooks import load_hook

# libyaml's parser and emitter where PyYAML was built with them (its wheels are): the same safe
# loading and the same documents, without the pure-Python scanner that dominated registering a
# model with a suite of hundreds of cases. Other builds fall back to the Python classes.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

FORMAT = "aieng-suite/1"
SUITE_DIR = "eval-suite"  # where a model folder or store version keeps its suite
SUITE_FILE = f"{SUITE_DIR}/suite.yaml"
SCHEMA_PATH = Path(__file__).with_name("suite.schema.json")
DEFAULT_SAMPLING = {"max_tokens": 64, "temperature": 0.0}
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "stop")  # the schema's `sampling` fields
DEFAULT_PROBE = {"per_family": 8, "seed": 4321}


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    messages: tuple[dict, ...] | None  # chat: /v1/chat/completions
    prompt: str | None  # raw text: /v1/completions
    sampling: dict  # the suite's defaults with the case's own settings over them
    expect: tuple[dict, ...] = ()
    weight: float = 1.0
    use: str = "both"  # gate | probe | both
    reference: str | None = None

    @property
    def labelled(self) -> bool:
        return bool(self.expect)

    @property
    def greedy(self) -> bool:
        return float(self.sampling.get("temperature", 0.0)) < GREEDY_BELOW  # as the engine decides it

    def brief(self) -> str:
        """The case's question, shortened, for refusals and tables."""
        text = self.prompt if self.prompt is not None else self.messages[-1]["content"]
        return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    sha256: str
    path: Path
    cases: tuple[Case, ...]
    thresholds: dict = field(default_factory=dict)  # as written: floors, max_regression, ... (gate.py reads it)
    perplexity_references: bool = False
    perplexity_text: Path | None = None
    probe: dict = field(default_factory=lambda: dict(DEFAULT_PROBE))
    refusal_patterns: tuple[str, ...] = ()
    description: str = ""
    document: dict = field(default_factory=dict, repr=False, compare=False)  # as read, for copies

    @property
    def label(self) -> str:
        """What a manifest records as the eval's ``suite``: ``name-vN``."""
        return f"{self.name}-v{self.version}"

    @property
    def families(self) -> list[str]:
        return list(dict.fromkeys(case.family for case in self.cases))

    @property
    def labelled(self) -> bool:
        """Whether any gate case carries assertions (else the suite is prompts only)."""
        return any(case.labelled for case in self.gate_cases())

    def gate_cases(self, per_family: int | None = None) -> list[Case]:
        """Cases graded before release, in file order; at most ``per_family`` of each family."""
        chosen = [case for case in self.cases if case.use in ("gate", "both")]
        if per_family is None:
            return chosen
        taken: dict[str, int] = {}
        out = []
        for case in chosen:
            if taken.get(case.family, 0) < per_family:
                taken[case.family] = taken.get(case.family, 0) + 1
                out.append(case)
        return out

    def record(self, file: str) -> dict:
        """What a manifest keeps of the suite stored with a version at ``file`` (relative path)."""
        return {
            "name": self.name,
            "version": self.version,
            "label": self.label,
            "sha256": self.sha256,
            "file": file,
            "labelled": self.labelled,
            "thresholds": self.thresholds,
        }


def suite_yaml(document: dict) -> str:
    """A suite document as the YAML text aieng writes (registration, captures, the demo's suite):
    keys in their order, text as it is, one line per value."""
    return yaml.dump(document, Dumper=_SAFE_DUMPER, sort_keys=False, allow_unicode=True, width=1000)


def load_suite(path: str | Path) -> Suite:
    """Read, check and hash the suite at ``path``; ``SuiteError`` says what is wrong and where."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SuiteError(f"cannot read the eval suite {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw) if path.suffix == ".json" else yaml.load(raw, Loader=_SAFE_LOADER)
    except (ValueError, yaml.YAMLError) as exc:
        raise SuiteError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    _check_schema(path, data)
    cases = tuple(_case(item, {**DEFAULT_SAMPLING, **data.get("defaults", {})}) for item in data["cases"])
    _check_meaning(path, data, cases)
    perplexity = data.get("perplexity", {})
    text = (path.parent / perplexity["text"]).resolve() if perplexity.get("text") else None
    if text is not None and not text.is_file():
        raise SuiteError(f"{path}: perplexity.text names {text}, which is not a file (paths are relative to the suite)")
    return Suite(
        name=data["name"],
        version=data["version"],
        sha256=suite_hash(data, text.read_bytes() if text else None),
        path=path.resolve(),
        cases=cases,
        thresholds=data.get("thresholds", {}),
        perplexity_references=bool(perplexity.get("references", False)),
        perplexity_text=text,
        probe={**DEFAULT_PROBE, **data.get("probe", {})},
        refusal_patterns=tuple(data.get("refusal_patterns", ())),
        description=data.get("description", ""),
        document=data,
    )


def largest_family(cases) -> int:
    """The most cases any one family has among ``cases`` (what a manifest records as ``n_per_family``)."""
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.family] = counts.get(case.family, 0) + 1
    return max(counts.values(), default=0)


def suite_hash(data: dict, text_bytes: bytes | None = None) -> str:
    """sha256 of the document as canonical JSON, the perplexity text's path replaced by its bytes'
    sha256: where the text lives does not change the suite, its content does."""
    document = json.loads(json.dumps(data))
    if text_bytes is not None:
        document["perplexity"]["text"] = "sha256:" + hashlib.sha256(text_bytes).hexdigest()
    canonical = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@cache
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _check_schema(path: Path, data) -> None:
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    shown = [f"at {_where(e.absolute_path)}: {e.message}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    raise SuiteError(
        f"{path} is not a valid eval suite ({FORMAT}, schema {SCHEMA_PATH.name}): " + "; ".join(shown) + more
    )


def _where(parts) -> str:
    return "/" + "/".join(str(p) for p in parts) if parts else "the top level"


def _case(item: dict, defaults: dict) -> Case:
    messages = item.get("messages")
    return Case(
        id=item["id"],
        family=item["family"],
        messages=tuple(dict(m) for m in messages) if messages else None,
        prompt=item.get("prompt"),
        sampling={**defaults, **item.get("sampling", {})},
        expect=tuple(item.get("expect", ())),
        weight=float(item.get("weight", 1.0)),
        use=item.get("use", "both"),
        reference=item.get("reference"),
    )


def _check_meaning(path: Path, data: dict, cases: tuple[Case, ...]) -> None:
    """What a schema cannot say: unique ids, patterns that compile, hooks that import, floors
    for families that exist."""
    problems = []
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            problems.append(f"case id {case.id!r} appears twice")
        seen.add(case.id)
        for assertion in case.expect:
            if "regex" in assertion:
                try:
                    re.compile(assertion["regex"])
                except re.error as exc:
                    problems.append(f"case {case.id}: regex {assertion['regex']!r} does not compile: {exc}")
            if "custom" in assertion:
                try:
                    resolve_hook(assertion["custom"])
                except SuiteError as exc:
                    problems.append(f"case {case.id}: {exc}")
    for pattern in data.get("refusal_patterns", ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(f"refusal pattern {pattern!r} does not compile: {exc}")
    families = {case.family for case in cases if case.use in ("gate", "both")}
    for family in data.get("thresholds", {}).get("floors", {}):
        if family not in families:
            problems.append(f"thresholds.floors names family {family!r}, which has no gate case")
    if data.get("perplexity", {}).get("references") and not any(c.reference for c in cases):
        problems.append("perplexity.references is on but no case has a reference answer")
    if problems:
        raise SuiteError(f"{path}: " + "; ".join(problems[:8]))


def resolve_hook(spec: str):
    """A custom assertion's ``module:function``; SuiteError when it cannot be loaded."""
    return load_hook(spec, named_by="custom assertion", error=SuiteError)
