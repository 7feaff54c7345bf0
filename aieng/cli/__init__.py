"""The ``aieng`` command line: one module per command group, wired in ``main``."""
