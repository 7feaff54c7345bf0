import os

import pytest


@pytest.fixture(scope="session")
def chromium():
    """The machine's Chromium, or a skip; CI (AIENG_REQUIRE_BROWSER=1, set by .ci/run) fails instead."""
    from aieng.workbook.book_browser import chromium_path

    path = chromium_path()
    if path is None:
        message = "no Chromium: apt-get install chromium (or set AIENG_CHROMIUM)"
        if os.environ.get("AIENG_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
