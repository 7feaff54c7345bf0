"""Run an eval suite (``suite_file``) on a model and grade it: per-family rates, per-case results.

A case passes when every assertion holds (``assertions``); a family's rate is the weighted share
of its labelled gate cases that pass. Unlabelled cases (no assertions) are answered and kept in
the results but not graded: they serve the comparison gate and the probes. Perplexity is
measured as the suite asks: of the cases' reference answers given their prompts (in process),
and of a text file (in process, or through a server).

The demo's held-out set is one such suite, shipped as a file (``aieng.demo.heldout_suite``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from aieng.evaluation.answers import Answer, model_answers, server_answers
from aieng.evaluation.assertions import failures
from aieng.evaluation.suite_file import Case, Suite, largest_family, load_suite

ANSWER_KEPT_CHARS = 200  # per case in the manifest: enough to see what changed, not a transcript


@dataclass(kw_only=True)
class EvalReport:
    """Result of one suite run.

    ``accuracy`` maps each family with labelled gate cases to its weighted pass rate in [0, 1];
    ``perplexity`` is the reference answers' (or, without references, the text's); ``cases``
    holds every case's result (id, family, passed, failures, answer) and ``mistakes`` the first
    few failures per family for people."""

    suite: str  # name-vN
    suite_sha256: str
    accuracy: dict[str, float]
    perplexity: float | None
    text_perplexity: float | None
    n_per_family: int
    seconds: float
    cases: list[dict] = field(default_factory=list)
    mistakes: dict[str, list[dict]] = field(default_factory=dict)

    def metrics(self) -> dict:
        data = {"accuracy": self.accuracy, "perplexity": self.perplexity}
        if self.text_perplexity is not None:
            data["text_perplexity"] = self.text_perplexity
        return data


def grade(suite: Suite, cases: list[Case], answers: list[Answer]) -> tuple[dict, list[dict], dict]:
    """(rate per family, per-case results, first mistakes per family) of ``answers`` to ``cases``."""
    results, weights, passed = [], {}, {}
    mistakes: dict[str, list[dict]] = {}
    for case, answer in zip(cases, answers):
        broken = failures(case, answer.text) if case.labelled else []
        results.append(
            {
                "id": case.id,
                "family": case.family,
                "passed": not broken if case.labelled else None,
                "failures": broken,
                "answer": answer.text[:ANSWER_KEPT_CHARS],
            }
        )
        if not case.labelled:
            continue
        weights[case.family] = weights.get(case.family, 0.0) + case.weight
        passed[case.family] = passed.get(case.family, 0.0) + (case.weight if not broken else 0.0)
        if broken and len(mistakes.setdefault(case.family, [])) < 3:
            mistakes[case.family].append({"id": case.id, "question": case.brief(), "got": answer.text, "why": broken})
    rates = {family: passed[family] / weights[family] for family in suite.families if weights.get(family)}
    return rates, results, mistakes


def _report(suite, cases, answers, perplexity, text_ppl, started) -> EvalReport:
    rates, results, mistakes = grade(suite, cases, answers)
    return EvalReport(
        suite=suite.label,
        suite_sha256=suite.sha256,
        accuracy=rates,
        perplexity=perplexity if perplexity is not None else text_ppl,
        text_perplexity=text_ppl,
        n_per_family=largest_family(cases),
        seconds=time.perf_counter() - started,
        cases=results,
        mistakes=mistakes,
    )


def evaluate(model, tokenizer, suite: Suite, *, per_family: int | None = None, batch_size: int = 32) -> EvalReport:
    """Grade ``model`` (in this process) on the suite's gate cases, at most ``per_family`` each."""
    from aieng.evaluation.perplexity import reply_perplexity, text_perplexity  # torch: the model is here

    started = time.perf_counter()
    cases = suite.gate_cases(per_family)
    was_training = model.training
    model.eval()
    try:
        answers = model_answers(model, tokenizer, cases, batch_size=batch_size)
        references = [(case, case.reference) for case in cases if case.reference is not None]
        perplexity = (
            reply_perplexity(model, tokenizer, references, batch_size=batch_size)
            if suite.perplexity_references and references
            else None
        )
        text_ppl = (
            text_perplexity(model, tokenizer, suite.perplexity_text.read_text()) if suite.perplexity_text else None
        )
    finally:
        model.train(was_training)
    return _report(suite, cases, answers, perplexity, text_ppl, started)


def evaluate_server(
    url: str, model: str, suite: Suite, *, per_family: int | None = None, token: str | None = None
) -> EvalReport:
    """Grade what the server at ``url`` answers for ``model``. Reference perplexity needs the
    weights in process and is not measured here; the text's is, through ``/v1/completions``."""
    from aieng.evaluation.perplexity import server_text_perplexity

    started = time.perf_counter()
    cases = suite.gate_cases(per_family)
    answers = server_answers(url, model, cases, token=token)
    text_ppl = (
        server_text_perplexity(url, model, suite.perplexity_text.read_text(), token=token)
        if suite.perplexity_text
        else None
    )
    return _report(suite, cases, answers, None, text_ppl, started)


def evaluate_dir(path: str | Path, suite: Suite | str | Path, **kwargs) -> EvalReport:
    """Load the model folder at ``path`` (local files only, no remote code) and :func:`evaluate` it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return evaluate(model, tokenizer, suite, **kwargs)
