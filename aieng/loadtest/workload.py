"""A load test's workload: what requests to send (classes with shares), how they arrive, how long.

A workload is a YAML or TOML file (format in ``docs/loadtest.md``; the built-in ones are
``aieng/loadtest/workloads/*.yaml``). Classes follow the first source article's load test: a mix
of short, medium and long requests, each with its own prompt and output length, because one
identical prompt at fixed concurrency hides queueing and head-of-line blocking.

Prompts are chat messages sent to ``/v1/chat/completions`` by default, so each server applies its
own chat template and the same workload runs against aieng, ``transformers serve`` or llama.cpp.
A class's prompt is one of: ``family`` (demo task prompts, e.g. ``[reverse, add]``), ``words``
(a demo task over N words, for long inputs) or ``text`` (fixed text). ``exact_tokens: true``
makes every reply exactly ``max_tokens`` long (each server's own way of ignoring EOS).
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from aieng.demo.corpus import FAMILIES, WORDS, training_examples
from aieng.errors import ConfigError

BUILT_IN = Path(__file__).with_name("workloads")
PROCESSES = ("closed", "constant", "poisson", "bursty")
ROUTES = ("/v1/chat/completions", "/v1/completions")


class WorkloadError(ConfigError):
    """A workload file that cannot be run: the message names the field and what it accepts."""


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float
    max_tokens: int
    family: tuple[str, ...] = ()  # demo task families to draw prompts from
    words: int = 0  # or: a `task` over this many demo words (long prompts)
    task: str = "reverse"
    text: str = ""  # or: this text, always
    exact_tokens: bool = False  # every reply exactly max_tokens long (EOS ignored)
    stream: bool = True  # False: one JSON reply (its first token is its end)
    # what a soak mixes in besides complete replies (an outcome the class asks for is not a failure):
    cancel_after: int = 0  # > 0: the client hangs up after this many streamed tokens ("cancelled")
    deadline_s: float = 0.0  # > 0: sent as aieng's `timeout` field; a 504 (or a timeout mid-stream) is expected
    invalid: bool = False  # send an out-of-range temperature; the 400 is expected

    @property
    def intent(self) -> str:
        """What this class's requests are meant to end in: complete | cancel | deadline | invalid."""
        return (
            "invalid"
            if self.invalid
            else "cancel"
            if self.cancel_after
            else "deadline"
            if self.deadline_s
            else "complete"
        )

    def prompts(self, n: int, seed: int) -> list[str]:
        rng = random.Random(f"loadtest:{seed}:{self.name}")
        if self.text:
            return [self.text] * n
        if self.words:
            return [f"{self.task}: " + " ".join(rng.choice(WORDS) for _ in range(self.words)) for _ in range(n)]
        mix = {family: 1.0 for family in self.family}
        return [e.prompt for e in training_examples(rng.randrange(2**31), n, mix=mix)]


@dataclass(frozen=True)
class Arrival:
    process: str = "poisson"  # closed | constant | poisson | bursty
    rate: float = 4.0  # requests per second (open loop)
    burstiness: float = 0.5  # bursty: gamma shape; < 1 burstier than Poisson (vLLM's meaning)
    users: int = 8  # closed loop: simulated users, each waits for its reply, thinks, asks again
    think_s: float = 1.0  # closed loop: mean think time (exponential)


@dataclass(frozen=True)
class Sweep:
    rates: tuple[float, ...] = ()  # open-loop rates to try in order; empty: start at `start`, x `factor`
    start: float = 2.0
    factor: float = 1.6
    max_levels: int = 8
    duration_s: float = 20.0  # per level


@dataclass(frozen=True)
class Workload:
    name: str
    classes: tuple[RequestClass, ...]
    arrival: Arrival = Arrival()
    sweep: Sweep = Sweep()
    model: str = "demo"
    route: str = "/v1/chat/completions"
    duration_s: float = 60.0
    max_requests: int = 5000
    warmup_s: float = 5.0  # requests started in the first warmup_s are sent but not counted
    cooldown_s: float = 2.0  # nor those started in the last cooldown_s
    timeout_s: float = 120.0  # per request
    seed: int = 0
    extra_body: dict = field(default_factory=dict)  # fields every request carries, e.g. temperature

    def with_arrival(self, **changes) -> Workload:
        return replace(self, arrival=replace(self.arrival, **changes))


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name (``default``, ``big``) or a ``.yaml``/``.yml``/``.toml`` file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = BUILT_IN / f"{name_or_path}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in BUILT_IN.glob("*.yaml"))
            raise WorkloadError(f"no built-in workload {name_or_path!r}; built in: {known}, or give a file path")
    if not path.exists():
        raise WorkloadError(f"workload file {path} does not exist")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise WorkloadError(f"{path} is not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}") from None
    return parse_workload(data, default_name=path.stem)


def parse_workload(data: object, default_name: str = "workload") -> Workload:
    """Validate a workload's fields; every mistake is a WorkloadError naming the field."""
    if not isinstance(data, dict):
        raise WorkloadError("a workload is a mapping with at least `classes`")
    known = {
        "name",
        "classes",
        "arrival",
        "sweep",
        "model",
        "route",
        "duration_s",
        "max_requests",
        "warmup_s",
        "cooldown_s",
        "timeout_s",
        "seed",
        "extra_body",
    }
    _no_unknown(data, known, "the workload")
    classes = data.get("classes")
    if not isinstance(classes, list) or not classes:
        raise WorkloadError("`classes` must be a non-empty list of request classes")
    parsed = tuple(_request_class(c, i) for i, c in enumerate(classes))
    total = sum(c.share for c in parsed)
    if abs(total - 1.0) > 1e-6:
        raise WorkloadError(f"the classes' shares must add up to 1, they add up to {total:g}")
    if len({c.name for c in parsed}) != len(parsed):
        raise WorkloadError("class names must be unique")
    route = data.get("route", "/v1/chat/completions")
    if route not in ROUTES:
        raise WorkloadError(f"`route` must be one of {ROUTES}, got {route!r}")
    workload = Workload(
        name=str(data.get("name", default_name)),
        classes=parsed,
        model=str(data.get("model", "demo")),
        route=route,
        arrival=_arrival(data.get("arrival", {})),
        sweep=_sweep(data.get("sweep", {})),
        extra_body=dict(data.get("extra_body") or {}),
        **{
            k: _number(data, k, float if k.endswith("_s") else int, minimum=0)
            for k in ("duration_s", "max_requests", "warmup_s", "cooldown_s", "timeout_s", "seed")
            if k in data
        },
    )
    if workload.warmup_s + workload.cooldown_s >= workload.duration_s:
        raise WorkloadError(
            f"warmup_s + cooldown_s ({workload.warmup_s + workload.cooldown_s:g}) must be shorter "
            f"than duration_s ({workload.duration_s:g}): nothing would be measured"
        )
    return workload


def _request_class(data: object, index: int) -> RequestClass:
    where = f"classes[{index}]"
    if not isinstance(data, dict):
        raise WorkloadError(f"{where} must be a mapping with name, share, max_tokens and a prompt")
    _no_unknown(
        data,
        {
            "name",
            "share",
            "max_tokens",
            "family",
            "words",
            "task",
            "text",
            "exact_tokens",
            "stream",
            "cancel_after",
            "deadline_s",
            "invalid",
        },
        where,
    )
    for required in ("name", "share", "max_tokens"):
        if required not in data:
            raise WorkloadError(f"{where} needs `{required}`")
    family = data.get("family", ())
    family = (family,) if isinstance(family, str) else tuple(family)
    if unknown := [f for f in family if f not in FAMILIES]:
        raise WorkloadError(f"{where}.family: {unknown} are not demo task families {list(FAMILIES)}")
    task = data.get("task", "reverse")
    if task not in FAMILIES:
        raise WorkloadError(f"{where}.task must be one of {list(FAMILIES)}, got {task!r}")
    prompt_kinds = [k for k in ("family", "words", "text") if data.get(k)]
    if len(prompt_kinds) != 1:
        raise WorkloadError(
            f"{where} needs exactly one prompt source of `family`, `words` or `text` (has {prompt_kinds or 'none'})"
        )
    share = _number(data, "share", float, minimum=0, where=where)
    if share > 1:
        raise WorkloadError(f"{where}.share is a fraction of the traffic between 0 and 1, got {share}")
    optional = {"cancel_after": (int, 0), "deadline_s": (float, 0.0)}
    klass = RequestClass(
        name=str(data["name"]),
        share=share,
        max_tokens=_number(data, "max_tokens", int, minimum=1, where=where),
        family=family,
        words=_number(data, "words", int, minimum=0, where=where) if "words" in data else 0,
        task=task,
        text=str(data.get("text", "")),
        exact_tokens=bool(data.get("exact_tokens", False)),
        stream=bool(data.get("stream", True)),
        invalid=bool(data.get("invalid", False)),
        **{
            k: _number(data, k, kind, minimum=0, where=where) if k in data else default
            for k, (kind, default) in optional.items()
        },
    )
    if klass.cancel_after and not klass.stream:
        raise WorkloadError(f"{where}: cancel_after hangs up a stream mid-way; it needs stream: true")
    if sum(bool(x) for x in (klass.cancel_after, klass.deadline_s, klass.invalid)) > 1:
        raise WorkloadError(f"{where}: use one of cancel_after, deadline_s and invalid per class")
    return klass


def _arrival(data: object) -> Arrival:
    if not isinstance(data, dict):
        raise WorkloadError("`arrival` must be a mapping, e.g. {process: poisson, rate: 4}")
    _no_unknown(data, {"process", "rate", "burstiness", "users", "think_s"}, "arrival")
    process = data.get("process", "poisson")
    if process not in PROCESSES:
        raise WorkloadError(f"arrival.process must be one of {PROCESSES}, got {process!r}")
    numbers = {
        k: _number(data, k, int if k == "users" else float, minimum=0, where="arrival")
        for k in ("rate", "burstiness", "users", "think_s")
        if k in data
    }
    arrival = Arrival(process=process, **numbers)
    if process != "closed" and arrival.rate <= 0 or process == "closed" and arrival.users < 1:
        raise WorkloadError("an open-loop arrival needs rate > 0, a closed loop users >= 1")
    if arrival.burstiness <= 0:
        raise WorkloadError("arrival.burstiness must be > 0 (1 is Poisson, smaller is burstier)")
    return arrival


def _sweep(data: object) -> Sweep:
    if not isinstance(data, dict):
        raise WorkloadError("`sweep` must be a mapping, e.g. {rates: [1, 2, 4, 8], duration_s: 20}")
    _no_unknown(data, {"rates", "start", "factor", "max_levels", "duration_s"}, "sweep")
    rates = data.get("rates", ())
    if not isinstance(rates, (list, tuple)) or any(not isinstance(r, (int, float)) or r <= 0 for r in rates):
        raise WorkloadError("sweep.rates must be a list of positive request rates")
    numbers = {
        k: _number(data, k, int if k == "max_levels" else float, minimum=0, where="sweep")
        for k in ("start", "factor", "max_levels", "duration_s")
        if k in data
    }
    sweep = Sweep(rates=tuple(float(r) for r in rates), **numbers)
    if sweep.factor <= 1 or sweep.start <= 0 or sweep.max_levels < 2:
        raise WorkloadError("sweep needs start > 0, factor > 1 and max_levels >= 2")
    return sweep


def _number(data: dict, key: str, kind: type, *, minimum: float, where: str = "the workload"):
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise WorkloadError(f"{where}.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if value < minimum:
        raise WorkloadError(f"{where}.{key} must be >= {minimum}, got {value}")
    return kind(value)


def _no_unknown(data: dict, known: set[str], where: str) -> None:
    if unknown := sorted(set(data) - known):
        raise WorkloadError(f"{where} has unknown field(s) {unknown}; known: {sorted(known)}")
