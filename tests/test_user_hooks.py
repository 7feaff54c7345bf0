"""A user's module:function hook: loaded once, or one clear error naming where it was named."""

import json

import pytest

from aieng.errors import ConfigError, SuiteError
from aieng.user_hooks import load_hook


def test_a_hook_loads_as_the_function_it_names():
    assert load_hook("json:dumps", named_by="AIENG_CAPTURE_REDACT") is json.dumps


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("json", "AIENG_GUARD_HOOK='json': give module:function"),
        ("no_such_module_here:f", "cannot be loaded (ModuleNotFoundError"),
        ("json:no_such_function", "cannot be loaded (AttributeError"),
        ("json:__doc__", "__doc__ is not callable"),
    ],
)
def test_a_bad_hook_is_one_error_naming_the_setting(spec, message):
    with pytest.raises(ConfigError) as caught:
        load_hook(spec, named_by="AIENG_GUARD_HOOK")
    assert message in caught.value.message and "AIENG_GUARD_HOOK" in caught.value.message


def test_the_error_class_is_the_callers():
    with pytest.raises(SuiteError, match="custom assertion='x:y' cannot be loaded"):
        load_hook("x:y", named_by="custom assertion", error=SuiteError)
