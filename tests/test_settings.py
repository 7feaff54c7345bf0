"""Settings: one default per knob, the same in Settings and in the component config it feeds."""

from dataclasses import fields

import pytest

from aieng.engine import EngineConfig
from aieng.errors import ConfigError
from aieng.loading.loader import LoadConfig
from aieng.scheduler import SchedulerConfig
from aieng.server.process.runtime import RuntimeConfig
from aieng.settings import Settings, env_name, settings_help

# Settings field -> (component config class, its field): the knobs Settings only passes on.
MIRRORED = {
    "compile": (EngineConfig, "compile"),
    "int8": (EngineConfig, "quantize_int8"),
    "max_batch_size": (SchedulerConfig, "max_batch_size"),
    "max_batch_tokens": (SchedulerConfig, "max_batch_tokens"),
    "max_queue": (SchedulerConfig, "max_queue"),
    "max_queue_delay_ms": (SchedulerConfig, "max_queue_delay_ms"),
    "request_timeout_s": (SchedulerConfig, "default_timeout_s"),
    "device": (LoadConfig, "device"),
    "dtype": (LoadConfig, "dtype"),
    "memory_headroom": (LoadConfig, "memory_headroom"),
    "gpu_memory_fraction": (LoadConfig, "gpu_memory_fraction"),
}


@pytest.mark.parametrize("name", sorted(MIRRORED))
def test_a_mirrored_setting_has_its_config_default(name):
    config, config_field = MIRRORED[name]
    assert getattr(Settings(), name) == getattr(config(), config_field)


def test_runtime_config_passes_every_mirrored_setting_on():
    changed = Settings(
        compile=False,
        int8=True,
        max_batch_size=7,
        max_batch_tokens=99,
        max_queue=5,
        max_queue_delay_ms=3.0,
        request_timeout_s=9.0,
        drain_delay_s=0.25,
    )
    config = RuntimeConfig.from_settings(changed)
    assert (config.engine.compile, config.engine.quantize_int8) == (False, True)
    assert (
        config.scheduler.max_batch_size,
        config.scheduler.max_batch_tokens,
        config.scheduler.max_queue,
        config.scheduler.max_queue_delay_ms,
        config.scheduler.default_timeout_s,
    ) == (7, 99, 5, 3.0, 9.0)
    assert config.drain_delay_s == 0.25
    assert RuntimeConfig(settings=Settings()).drain_delay_s == Settings().drain_delay_s
    assert LoadConfig.from_settings(Settings(device="cpu", dtype="float16")) == LoadConfig(
        device="cpu", dtype="float16"
    )


def changed_value(name: str, default):
    """A valid value other than ``default`` for the setting ``name``."""
    choices = {"weight_formats": "bfloat16", "decode_attention": "sdpa", "kv_cache_dtype": "bfloat16"}
    if name in choices:
        return choices[name]
    if isinstance(default, bool):
        return not default
    return 7 if default is None else type(default)(default + 1)


def test_every_engine_setting_of_the_same_name_reaches_the_engine_config():
    """A setting the runtime forgets to pass on would be read, documented and ignored."""
    shared = sorted({f.name for f in fields(EngineConfig)} & {f.name for f in fields(Settings)})
    assert "prefix_cache" in shared and "kv_cache_dtype" in shared
    for name in shared:
        value = changed_value(name, getattr(Settings(), name))
        engine = RuntimeConfig.from_settings(Settings(**{name: value})).engine
        assert getattr(engine, name) == value, name


def test_a_notebook_builds_the_engine_aieng_serve_builds():
    """One set of defaults: the configs a notebook, a benchmark or a test gets by default are the
    ones `aieng serve` derives from the settings when nothing is set."""
    served = RuntimeConfig.from_settings(Settings())
    assert EngineConfig() == served.engine
    assert SchedulerConfig() == served.scheduler
    assert LoadConfig() == LoadConfig.from_settings(Settings())
    exact = EngineConfig.exact()
    assert (exact.weight_formats, exact.kv_cache_dtype, exact.compile_budget_s) == ("float32", "model", None)
    assert EngineConfig.exact(compile=False).compile is False


def test_the_engine_owns_no_scheduling_setting():
    assert "max_batch_size" not in {f.name for f in fields(EngineConfig)}


def test_environment_then_flags(monkeypatch):
    monkeypatch.setenv("AIENG_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("AIENG_COMPILE", "off")
    monkeypatch.setenv("AIENG_LOG_PAYLOAD_SAMPLE", "0.5")
    settings = Settings.from_env(port=9000)
    assert (settings.max_batch_size, settings.compile, settings.log_payload_sample, settings.port) == (
        8,
        False,
        0.5,
        9000,
    )
    assert Settings.from_env(max_batch_size="4").max_batch_size == 4  # flags may arrive as strings


@pytest.mark.parametrize(
    "name,raw", [("AIENG_PORT", "http"), ("AIENG_COMPILE", "maybe"), ("AIENG_LOG_PAYLOAD_SAMPLE", "1.5")]
)
def test_a_bad_value_names_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=name):
        Settings.from_env()


def test_every_setting_is_in_serve_help_with_its_default():
    text = settings_help()
    for f in fields(Settings):
        assert env_name(f.name) in text and f.metadata["help"].split()[0] in text
