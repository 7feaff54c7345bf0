"""Quality of a model version: eval suites (files the user owns), graded answers, perplexity, the
release gate and the comparison with the stable version.

Results go into a version's manifest and are what release gates and rollback decisions compare
(docs/evaluation.md; docs/architecture.md, "manifest.json"). Import the modules you need
(``aieng.evaluation.suite_file``, ``.suite``, ``.gate``, ``.compare``): this package imports
nothing heavy on its own.
"""
