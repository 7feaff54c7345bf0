"""Repository-wide pytest set-up, for the test suite and for notebooks run under nbval alike.

Servers started by tests, notebooks and runbooks run eagerly: ``aieng serve`` compiles the decode
step during warm-up by default (15-60 s per start), which a suite that starts a dozen servers
cannot afford. The compiled path has its own tests (tests/engine/test_compile.py).
"""

import os

os.environ.setdefault("AIENG_COMPILE", "0")
