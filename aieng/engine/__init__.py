"""Text generation. ``reference`` wraps transformers' ``generate()``: the walking skeleton's engine
and, later, the baseline the hand-written loop is checked against."""

from aieng.engine.params import GenerationResult, SamplingParams, validate_request
from aieng.engine.reference import ReferenceGenerator

__all__ = ["GenerationResult", "ReferenceGenerator", "SamplingParams", "validate_request"]
