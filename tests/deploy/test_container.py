"""deploy/container: the Dockerfile lints clean and agrees with the server's settings, and the
scripts it runs (dependency install, entry point) are exercised here, since no Docker daemon runs
on the CI machine (the image itself is built where one does: deploy/container/README.md)."""

import fnmatch
import os
import re
import subprocess
import sys
from dataclasses import fields

from manifests import ROOT

from aieng.settings import Settings, env_name

CONTAINER = ROOT / "deploy" / "container"
DOCKERFILE = CONTAINER / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def hadolint(path) -> subprocess.CompletedProcess:
    binary = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return subprocess.run(
        [binary, "--failure-threshold", "info", str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_dockerfile_lints_clean_and_a_bad_one_does_not(tmp_path):
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("g++=4:12.2.0-3", "g++").replace("USER 10001", "USER root"))
    result = hadolint(bad)
    assert result.returncode != 0 and "DL3008" in result.stdout and "DL3002" in result.stdout


def test_the_image_runs_as_a_non_root_user_with_settings_the_server_knows():
    stage = final_stage()
    users = [args for op, args in stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(args for op, args in stage if op == "ENV")))
    known = {env_name(f.name) for f in fields(Settings)}
    assert {name for name in env if name.startswith("AIENG_")} <= known
    assert env["AIENG_HOST"] == "0.0.0.0"  # loopback, the default, is unreachable from outside the container
    expose = [args for op, args in stage if op == "EXPOSE"]
    assert expose == [env["AIENG_PORT"]] and int(env["AIENG_PORT"]) == Settings().port
    volumes = next(args for op, args in stage if op == "VOLUME")
    assert env["AIENG_STORE"] in volumes and any(
        env["AIENG_COMPILE_CACHE_DIR"].startswith(v.strip('[]", ')) for v in volumes.split(",")
    )
    healthcheck = next(args for op, args in stage if op == "HEALTHCHECK")
    assert "healthcheck.py" in healthcheck and '"ready"' in healthcheck
    assert next(args for op, args in stage if op == "ENTRYPOINT") == '["/opt/aieng/entrypoint.sh"]'


def test_every_copied_file_exists_and_the_dockerignore_lets_it_into_the_context():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]

    def in_context(path: str) -> bool:
        included = True
        for pattern in patterns:  # Docker's rule: the last matching pattern wins
            negated = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                included = negated
        return included

    copied = []
    for op, args in instructions(DOCKERFILE.read_text()):
        if op == "COPY" and "--from" not in args:
            copied += args.split()[:-1]
    assert len(copied) >= 6
    for source in copied:
        assert (ROOT / source).exists(), source
        assert in_context(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    assert not in_context(".venv") and not in_context("var/store") and not in_context(".git")


def test_the_image_installs_torch_by_variant_every_file_hash_checked():
    script = ROOT / "scripts" / "install-deps.sh"
    lock = "locks/server.lock"
    cpu = subprocess.run([script, "--dry-run", "cpu", "/venv", lock], capture_output=True, text=True, check=True)
    pips = [line for line in cpu.stdout.splitlines() if " -m pip install " in line]
    assert all("--require-hashes" in line for line in pips) and len(pips) == 3
    assert "--no-deps --index-url https://download.pytorch.org/whl/cpu" in pips[1] and "torch-cpu.lock" in pips[1]
    assert pips[2].endswith(f"-r {lock}")
    gpu = subprocess.run([script, "--dry-run", "gpu", "/venv", lock], capture_output=True, text=True, check=True)
    assert "--no-deps -r" in gpu.stdout and "torch-registry.lock" in gpu.stdout and "whl/cpu" not in gpu.stdout
    build = next(args for op, args in instructions(DOCKERFILE.read_text()) if op == "RUN" and "install-deps.sh" in args)
    assert 'install-deps.sh "${VARIANT}" /opt/aieng/venv locks/server.lock' in build
    bad = subprocess.run([script, "tpu", "/venv"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cpu, registry, gpu or auto" in bad.stderr


def test_the_entrypoint_init_is_idempotent_and_refuses_a_model_the_store_lacks(demo_store, tmp_path):
    entrypoint = CONTAINER / "entrypoint.sh"
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    again = subprocess.run(
        [entrypoint, "init"],
        env={**env, "AIENG_STORE": str(demo_store.root), "AIENG_MODEL": "demo"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    missing = subprocess.run(
        [entrypoint, "init"],
        env={**env, "AIENG_STORE": str(tmp_path / "empty"), "AIENG_MODEL": "llama@2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 1 and "register" in missing.stderr
    listed = subprocess.run(
        [entrypoint, "model", "list"],
        env={**env, "AIENG_STORE": str(demo_store.root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "demo" in listed.stdout
    unset = subprocess.run(
        [entrypoint, "init"], env={k: v for k, v in env.items() if k != "AIENG_STORE"}, capture_output=True, text=True
    )
    assert unset.returncode != 0 and "AIENG_STORE" in unset.stderr


def test_the_healthcheck_refuses_an_unknown_route():
    run = subprocess.run([sys.executable, CONTAINER / "healthcheck.py", "nonsense"], capture_output=True, text=True)
    assert run.returncode == 2 and "ready or live" in run.stderr
