"""Warm-up: the shapes run smallest first, and the larger ones are skipped once one is slow."""

import logging

from aieng.engine import Engine, EngineConfig


def _warm(demo, **config):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False, **config))
    details = []
    engine.warmup(progress=details.append)
    return [d for d in details if d.startswith("prefill and decode")], details


def test_every_shape_runs_smallest_first_when_each_is_quick(demo):
    ran, _ = _warm(
        demo, warmup_batch_sizes=(1, 8), warmup_prompt_lengths=(128, 8, 32), warmup_eager_shape_limit_s=float("inf")
    )
    shapes = [d.split(", ")[1] for d in ran]
    assert shapes == [f"batch {b} × {n} tokens" for b, n in [(1, 8), (1, 32), (8, 8), (1, 128), (8, 32), (8, 128)]]


def test_a_shape_past_the_limit_ends_the_eager_warm_up(demo, caplog):
    caplog.set_level(logging.INFO, logger="aieng.engine")
    ran, details = _warm(demo, warmup_batch_sizes=(1, 8), warmup_prompt_lengths=(8, 32), warmup_eager_shape_limit_s=0.0)
    # the first shape never ends it: its time is mostly the first call's set-up, what warm-up is for
    assert len(ran) == 2 and "batch 1 × 8 tokens" in ran[0] and "batch 1 × 32 tokens" in ran[1]
    assert any(d.startswith("skipping the larger shapes (8 × 8, 8 × 32)") for d in details)
    skipped = [r for r in caplog.records if getattr(r, "event", None) == "engine_warmup_skipped"]
    assert len(skipped) == 1 and skipped[0].shapes == [[8, 8], [8, 32]]
