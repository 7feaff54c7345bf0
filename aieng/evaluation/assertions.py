"""The assertions a suite case can make about an answer, each returning why it failed (or None).

One function per kind, so a report can say which assertion failed and how: ``exact``,
``contains``, ``regex`` (a search, anchor it yourself), ``json_schema`` (the answer parses as
JSON and validates), ``one_of``, ``max_length`` (characters), ``not_empty`` and ``custom``
(``module:function`` called with the answer and the case; True/None passes, False or a string
fails, the string being the reason). The answer is compared as the model's reply with
surrounding whitespace stripped, as the demo's held-out suite always scored it.
"""

from __future__ import annotations

import json
import re

from aieng.evaluation.suite_file import Case, resolve_hook


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _exact(expected: str, answer: str, case: Case) -> str | None:
    return None if answer == expected else f"exact: expected {_short(expected)}, got {_short(answer)}"


def _contains(needle: str, answer: str, case: Case) -> str | None:
    return None if needle in answer else f"contains: {_short(needle)} not in {_short(answer)}"


def _regex(pattern: str, answer: str, case: Case) -> str | None:
    return None if re.search(pattern, answer) else f"regex: {pattern!r} does not match {_short(answer)}"


def _json_schema(schema: dict, answer: str, case: Case) -> str | None:
    from jsonschema import Draft202012Validator

    try:
        value = json.loads(answer)
    except ValueError as exc:
        return f"json_schema: not JSON ({exc.args[0] if exc.args else exc}): {_short(answer)}"
    error = next(iter(Draft202012Validator(schema).iter_errors(value)), None)
    return None if error is None else f"json_schema: {error.message}"


def _one_of(choices: list[str], answer: str, case: Case) -> str | None:
    return None if answer in choices else f"one_of: {_short(answer)} is none of {choices[:5]}"


def _max_length(limit: int, answer: str, case: Case) -> str | None:
    return None if len(answer) <= limit else f"max_length: {len(answer)} characters > {limit}"


def _not_empty(_: bool, answer: str, case: Case) -> str | None:
    return None if answer else "not_empty: the answer is empty"


def _custom(spec: str, answer: str, case: Case) -> str | None:
    try:
        verdict = resolve_hook(spec)(answer, case)
    except Exception as exc:  # a user's hook: its failure fails the case, not the run
        return f"custom {spec}: raised {type(exc).__name__}: {exc}"
    if verdict is True or verdict is None:
        return None
    return f"custom {spec}: {verdict if isinstance(verdict, str) else 'returned ' + repr(verdict)}"


CHECKS = {
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "json_schema": _json_schema,
    "one_of": _one_of,
    "max_length": _max_length,
    "not_empty": _not_empty,
    "custom": _custom,
}


def failures(case: Case, answer: str) -> list[str]:
    """Every assertion of ``case`` the answer breaks (empty: the case passes)."""
    out = []
    for assertion in case.expect:
        ((kind, value),) = assertion.items()
        failure = CHECKS[kind](value, answer, case)
        if failure:
            out.append(failure)
    return out
