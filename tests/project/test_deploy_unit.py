"""The systemd unit gives the drain the signal and the time it needs, and keeps the compile cache."""

from pathlib import Path

from aieng.settings import Settings

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "aieng.service"


def _service_settings() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_stop_signal_and_timeout_cover_the_graceful_drain():
    service = _service_settings()
    settings = Settings()
    assert service["KillSignal"] == ["SIGTERM"]
    assert int(service["TimeoutStopSec"][0]) > settings.graceful_timeout_s + settings.drain_delay_s


def test_inductor_cache_lives_in_the_units_cache_directory():
    service = _service_settings()
    env = dict(item.split("=", 1) for item in service["Environment"])
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(f"/var/cache/{service['CacheDirectory'][0]}/")
