"""deploy/systemd/aieng.service: crashes restart with a back-off, a crash loop reaches the start
limit, a verification failure is not restarted, and the stop sequence (signal, kill mode, timeout)
leaves the server's drain the time its settings give it. Broken units fail the same checks, and
systemd-analyze, where installed, finds no directive it does not know or cannot parse."""

import re
import shlex
import shutil
import subprocess
from dataclasses import fields

import pytest
from manifests import ROOT

from aieng.settings import Settings, _coerce, env_name

UNIT = ROOT / "deploy" / "systemd" / "aieng.service"
SETTINGS_ENV = {env_name(f.name): f.name for f in fields(Settings)}
# The unit's own comment: a start with the compile cache warm takes up to this long. A crash loop
# that dies after warm starts must still reach the start limit.
WARM_START_S = 30.0
# The stop timeout covers the drain and leaves at least this much for the processes to exit.
STOP_MARGIN_S = 10.0
# systemd >= 254 reads these; older versions warn "Unknown key" and restart every RestartSec.
BACK_OFF_KEYS = ("RestartSteps", "RestartMaxDelaySec")

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """{section: {key: [values in order]}}: a key may repeat (Environment=), comments dropped."""
    unit: Unit = {}
    section = None
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
        else:
            key, value = line.split("=", 1)
            section.setdefault(key.strip(), []).append(value.strip())
    return unit


def last(unit: Unit, section: str, key: str) -> str | None:
    """A key's value as systemd takes it: the last assignment wins."""
    values = unit.get(section, {}).get(key)
    return values[-1] if values else None


_SPAN_UNITS = {
    "us": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}


def span_s(value: str) -> float:
    """A systemd time span in seconds ("90", "90s", "2min", "1min 30s"); a bare number is seconds."""
    if value.strip() == "infinity":
        return float("inf")
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value.strip())
    assert parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[a-z]*)+\s*", value), f"not a time span: {value!r}"
    return sum(float(number) * _SPAN_UNITS[unit or "s"] for number, unit in parts)


def environment(unit: Unit) -> dict[str, str]:
    """The Environment= assignments (several per line allowed, quoted as systemd quotes them)."""
    env = {}
    for line in unit["Service"].get("Environment", []):
        for item in shlex.split(line):
            name, value = item.split("=", 1)
            env[name] = value
    return env


def setting(unit: Unit, name: str):
    """The value the server will run with: the unit's Environment=, else Settings' default."""
    raw = environment(unit).get(env_name(name))
    return _coerce(name, raw) if raw is not None else getattr(Settings(), name)


def restart_delays_s(unit: Unit, count: int) -> list[float]:
    """The delays before the first `count` automatic restarts, as systemd computes them
    (service_restart_usec_next: RestartSec, then geometric over RestartSteps up to
    RestartMaxDelaySec). Without the back-off keys (or on systemd < 254): RestartSec each time."""
    first = span_s(last(unit, "Service", "RestartSec") or "100ms")
    steps = int(last(unit, "Service", "RestartSteps") or 0)
    cap = span_s(last(unit, "Service", "RestartMaxDelaySec") or "infinity")
    if steps == 0 or first == 0 or cap == float("inf") or first >= cap:
        return [first] * count
    return [cap if n > steps else first * (cap / first) ** ((n - 1) / steps) for n in range(1, count + 1)]


def check_restart_policy(unit: Unit) -> None:
    service = unit["Service"]
    assert last(unit, "Service", "Restart") == "on-failure"
    # exit 1 is a refused verification or load: restarting would only repeat it
    assert "1" in " ".join(service.get("RestartPreventExitStatus", [])).split()
    assert span_s(last(unit, "Service", "RestartSec")) > 0
    if any(key in service for key in BACK_OFF_KEYS):  # systemd ignores a cap without steps
        assert all(key in service for key in BACK_OFF_KEYS), f"set {' and '.join(BACK_OFF_KEYS)} together"
        assert span_s(last(unit, "Service", "RestartMaxDelaySec")) > span_s(last(unit, "Service", "RestartSec"))


def check_start_limit(unit: Unit) -> None:
    for key in ("StartLimitIntervalSec", "StartLimitBurst"):
        assert last(unit, "Unit", key) is not None, f"{key} belongs in [Unit]"
        assert key not in unit["Service"], f"{key} belongs in [Unit], not [Service]"
    interval = span_s(last(unit, "Unit", "StartLimitIntervalSec"))
    burst = int(last(unit, "Unit", "StartLimitBurst"))
    assert 0 < interval < float("inf") and burst > 0  # 0 or infinity: no limit at all
    # The start after `burst` restarts is refused only if it falls inside the interval: the back-off
    # of those restarts (the longest, geometric one) and a warm start before each crash must fit.
    needed = sum(restart_delays_s(unit, burst)) + burst * WARM_START_S
    assert needed < interval, f"{burst} crashes take {needed:.0f} s: the {interval:.0f} s start limit never trips"


def check_stop_sequence(unit: Unit) -> None:
    service = unit["Service"]
    assert last(unit, "Service", "KillSignal") == "SIGTERM"  # the server's drain signal
    assert last(unit, "Service", "KillMode") == "mixed"  # only the master gets it; it signals the workers
    assert "ExecStop" not in service  # SIGTERM is the stop command
    drain = setting(unit, "drain_delay_s") + setting(unit, "graceful_timeout_s")
    timeout = span_s(last(unit, "Service", "TimeoutStopSec"))
    assert timeout > drain + STOP_MARGIN_S, f"SIGKILL at {timeout:g} s cuts a {drain:g} s drain short"


def test_systemd_time_spans_parse_as_systemd_reads_them():
    assert span_s("90") == span_s("90s") == span_s("1min 30s") == span_s("1min30s") == 90
    assert span_s("2min") == 120 and span_s("500ms") == 0.5 and span_s("1h") == 3600
    with pytest.raises(AssertionError):
        span_s("five")


def test_environment_names_and_values_are_settings_the_server_accepts():
    for name, value in environment(parse_unit(UNIT.read_text())).items():
        if name.startswith("AIENG_"):
            assert name in SETTINGS_ENV, f"{name} is not a setting (aieng serve --help lists them)"
            _coerce(SETTINGS_ENV[name], value)  # raises ConfigError as the server would at start-up


def test_crashes_restart_with_a_back_off_but_a_verification_failure_does_not():
    unit = parse_unit(UNIT.read_text())
    check_restart_policy(unit)
    delays = restart_delays_s(unit, 10)
    assert delays == sorted(delays) and delays[0] < delays[-1]  # it backs off (where systemd can)


def test_a_crash_loop_reaches_the_start_limit():
    check_start_limit(parse_unit(UNIT.read_text()))


def test_the_stop_timeout_outlasts_the_drain_and_only_the_master_gets_sigterm():
    unit = parse_unit(UNIT.read_text())
    check_stop_sequence(unit)
    # no Environment= sets them today: the drain is the settings' defaults
    assert setting(unit, "graceful_timeout_s") == Settings().graceful_timeout_s


def test_a_stop_timeout_shorter_than_the_drain_fails_the_check():
    text = UNIT.read_text()
    short = parse_unit(re.sub(r"(?m)^TimeoutStopSec=.*$", "TimeoutStopSec=20s", text))
    with pytest.raises(AssertionError, match="cuts a"):
        check_stop_sequence(short)
    # a longer graceful timeout set in the unit counts, not only the default
    longer = text.replace("[Service]\n", "[Service]\nEnvironment=AIENG_GRACEFUL_TIMEOUT_S=120\n")
    with pytest.raises(AssertionError, match="cuts a"):
        check_stop_sequence(parse_unit(longer))
    control_group = parse_unit(re.sub(r"(?m)^KillMode=.*$", "KillMode=control-group", text))
    with pytest.raises(AssertionError):
        check_stop_sequence(control_group)


def test_a_start_limit_the_back_off_outruns_or_a_misplaced_one_fails_the_check():
    text = UNIT.read_text()
    with pytest.raises(AssertionError, match="never trips"):
        check_start_limit(parse_unit(re.sub(r"(?m)^RestartMaxDelaySec=.*$", "RestartMaxDelaySec=30min", text)))
    with pytest.raises(AssertionError, match="never trips"):
        check_start_limit(parse_unit(re.sub(r"(?m)^StartLimitIntervalSec=.*$", "StartLimitIntervalSec=10s", text)))
    moved = re.sub(r"(?m)^StartLimitBurst=.*\n", "", text).replace("[Service]\n", "[Service]\nStartLimitBurst=5\n")
    with pytest.raises(AssertionError, match=r"belongs in \[Unit\]"):
        check_start_limit(parse_unit(moved))
    with pytest.raises(AssertionError):
        check_restart_policy(parse_unit(re.sub(r"(?m)^RestartPreventExitStatus=.*\n", "", text)))


def systemd_version(binary: str) -> int:
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    return int(re.match(r"systemd (\d+)", output).group(1))


def verify_problems(analyze: str, path) -> list[str]:
    """systemd-analyze verify's complaints about the unit's own lines (unknown keys, unparsable
    values); what it says about the host (no /opt/aieng, no user aieng) is not the file's fault."""
    result = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    lines = re.findall(rf"(?m)^{re.escape(str(path))}:\d+: (.*)$", result.stdout + result.stderr)
    if systemd_version(analyze) < 254:  # the back-off keys are newer than this systemd: see the unit
        lines = [line for line in lines if not any(f"Unknown key '{key}'" in line for key in BACK_OFF_KEYS)]
    return lines


def test_systemd_analyze_finds_no_unknown_or_invalid_directive(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    assert verify_problems(analyze, UNIT) == []
    broken = tmp_path / "aieng.service"
    broken.write_text(
        UNIT.read_text().replace("KillMode=mixed", "KillMode=mixd").replace("StartLimitBurst", "StartLimitBurts")
    )
    problems = verify_problems(analyze, broken)
    assert len(problems) == 2 and "StartLimitBurts" in problems[0] and "mixd" in problems[1], problems
