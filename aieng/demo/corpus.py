"""Task families of the demo corpus, and the fixed split between training and held-out prompts.

Every example is a (prompt, answer) pair whose answer a program can check exactly, so the
demo model's quality is a number (exact-match accuracy per family) rather than an opinion.
The user message names its task (``reverse: ...``, ``json: ...``) so one model serves all
families through one chat template and a human reading a prompt knows what to expect.

The held-out split is a pure function of the prompt text (a salted SHA-256), not of any seed:
every build, whatever its seed, avoids the same held-out prompts, and ``aieng eval`` can grade
any build on prompts it has provably never trained on.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, replace

#: Task families, in the order reports list them.
FAMILIES: tuple[str, ...] = ("reverse", "json", "add", "sort")

#: Changing the salt or the fraction changes which prompts are held out, which invalidates
#: every accuracy number measured so far: bump the suite name in ``aieng.evaluation`` with it.
SPLIT_SALT = "aieng-demo-split-v1"
HELD_OUT_PER_MILLE = 100  # 10 % of the prompt space of every family is never trained on

# Short, common words so that each is (nearly always) one BPE token: the tasks then test
# ordering and copying of tokens, which a model of under a million parameters learns in minutes.
# Few words (32) also means each is seen often enough in a two-minute build.
WORDS: tuple[str, ...] = (
    "apple",
    "bird",
    "cake",
    "desk",
    "egg",
    "fish",
    "gold",
    "hill",
    "ice",
    "jam",
    "king",
    "lamp",
    "moon",
    "nest",
    "oak",
    "pen",
    "queen",
    "rain",
    "salt",
    "tree",
    "van",
    "wolf",
    "zoo",
    "boat",
    "door",
    "glass",
    "milk",
    "river",
    "stone",
    "star",
    "road",
    "sand",
)
NAMES: tuple[str, ...] = (
    "ana",
    "bob",
    "carl",
    "dina",
    "eva",
    "finn",
    "hugo",
    "jon",
    "kim",
    "lea",
    "mia",
    "nora",
    "omar",
    "paul",
    "sam",
    "tom",
)
CITIES: tuple[str, ...] = ("paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "berlin", "madrid", "quito")
COLORS: tuple[str, ...] = ("red", "blue", "green", "black", "white", "pink", "gray", "brown")
PETS: tuple[str, ...] = ("cat", "dog", "fish", "bird", "horse", "rabbit")

# key -> value vocabulary (a tuple of strings) or an inclusive integer range.
JSON_FIELDS: dict[str, tuple[str, ...] | tuple[int, int]] = {
    "name": NAMES,
    "city": CITIES,
    "color": COLORS,
    "pet": PETS,
    "age": (1, 99),
    "score": (0, 99),
}


@dataclass(frozen=True)
class Example:
    """One checkable task: the user message (``prompt``) and the exact expected reply.

    ``system`` is an optional system message in front of the prompt; it never changes the
    answer (training sees a few so that chat clients that always send one still work).
    """

    family: str
    prompt: str
    answer: str
    system: str | None = None


def is_held_out(prompt: str) -> bool:
    """True when ``prompt`` belongs to the held-out part of the prompt space.

    Deterministic and independent of any seed, so training (which rejects these prompts) and
    evaluation (which only draws these prompts) agree without sharing state.
    """
    digest = hashlib.sha256(f"{SPLIT_SALT}\0{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 1000 < HELD_OUT_PER_MILLE


def _reverse(rng: random.Random) -> Example:
    words = rng.sample(WORDS, rng.randint(3, 5))
    return Example("reverse", "reverse: " + " ".join(words), " ".join(reversed(words)))


def _sort(rng: random.Random) -> Example:
    words = rng.sample(WORDS, rng.randint(3, 4))
    return Example("sort", "sort: " + " ".join(words), " ".join(sorted(words)))


def _add(rng: random.Random) -> Example:
    a, b = rng.randint(10, 99), rng.randint(10, 99)  # two-digit operands: fixed digit positions
    return Example("add", f"add: {a}+{b}", str(a + b))


def _json(rng: random.Random) -> Example:
    keys = rng.sample(sorted(JSON_FIELDS), rng.randint(2, 3))
    record: dict[str, str | int] = {}
    for key in keys:
        domain = JSON_FIELDS[key]
        if isinstance(domain[0], int):
            record[key] = rng.randint(domain[0], domain[1])  # type: ignore[arg-type]
        else:
            record[key] = rng.choice(domain)  # type: ignore[arg-type]
    prompt = "json: " + " ".join(f"{k}={v}" for k, v in record.items())
    # json.dumps with default separators: {"name": "ana", "age": 31}
    return Example("json", prompt, json.dumps(record))


_GENERATORS = {"reverse": _reverse, "json": _json, "add": _add, "sort": _sort}

#: Share of each family in the training mix, tuned on the default build: addition and the
#: digit copying inside json need the most examples; reversal and sorting are learnt early.
DEFAULT_MIX: dict[str, float] = {"reverse": 0.2, "json": 0.3, "add": 0.35, "sort": 0.15}


#: System messages sprinkled over the training corpus (the OpenAI client and most chat UIs send
#: one). The model learns to read past them; their text carries no task information.
SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a precise assistant. Answer briefly.",
    "Follow the instruction exactly.",
    "You are aieng, a small demo model.",
)
SYSTEM_PROMPT_SHARE = 0.05


def _draw(family: str, rng: random.Random, *, held_out: bool) -> Example:
    """Rejection-sample one example of ``family`` from the requested side of the split."""
    generate = _GENERATORS[family]
    while True:
        example = generate(rng)
        if is_held_out(example.prompt) == held_out:
            return example


def training_examples(seed: int, n: int, *, mix: dict[str, float] | None = None) -> list[Example]:
    """``n`` training examples (never a held-out prompt), deterministic in ``seed``.

    Families are drawn at random with the weights of ``mix`` (default :data:`DEFAULT_MIX`);
    prompts repeat across the list where a family's prompt space is small (addition). About
    :data:`SYSTEM_PROMPT_SHARE` of the examples carry a system message.
    """
    weights = mix or DEFAULT_MIX
    unknown = set(weights) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown task families in mix: {sorted(unknown)}")
    families = [f for f in FAMILIES if weights.get(f, 0) > 0]
    rng = random.Random(f"train:{seed}")
    chosen = rng.choices(families, weights=[weights[f] for f in families], k=n)
    examples = [_draw(family, rng, held_out=False) for family in chosen]
    system_rng = random.Random(f"system:{seed}")  # own stream: tasks do not depend on it
    return [
        replace(e, system=system_rng.choice(SYSTEM_PROMPTS)) if system_rng.random() < SYSTEM_PROMPT_SHARE else e
        for e in examples
    ]


def held_out_examples(seed: int, n_per_family: int) -> list[Example]:
    """``n_per_family`` distinct held-out examples of every family, deterministic in ``seed``.

    Grouped by family in :data:`FAMILIES` order. Only prompts for which :func:`is_held_out`
    is true are drawn, so no training corpus (of any seed) contains them.
    """
    out: list[Example] = []
    for family in FAMILIES:
        rng = random.Random(f"heldout:{seed}:{family}")
        seen: set[str] = set()
        attempts = 0
        while len(seen) < n_per_family:
            example = _draw(family, rng, held_out=True)
            attempts += 1
            if attempts > 200 * n_per_family + 1000:
                raise ValueError(f"cannot draw {n_per_family} distinct held-out {family!r} prompts")
            if example.prompt not in seen:
                seen.add(example.prompt)
                out.append(example)
    return out
