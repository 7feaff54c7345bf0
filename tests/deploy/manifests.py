"""What the deploy tests share: the rendered overlays, a validator that knows every kind it is
given (Kubernetes' own schemas, or the CRD schemas carried in crds/), and the server's routes.

The command-line tools (kubectl for kustomize, promtool, haproxy) come from Debian packages that
`.ci/run` installs. Where one is missing a test skips and says which, except under
AIENG_REQUIRE_DEPLOY_TOOLS=1 (set by `.ci/run`), where it fails: CI must not pass by skipping.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "cpu-keda")
CRDS = Path(__file__).with_name("crds")
# The oldest Kubernetes the manifests promise to work on, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.30.0", "latest")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (apt-get install {'prometheus' if name == 'promtool' else name})"
        if os.environ.get("AIENG_REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail(message + "; AIENG_REQUIRE_DEPLOY_TOOLS=1 says CI must have it")
        pytest.skip(message)
    return path


def kustomize(directory: Path) -> list[dict]:
    kubectl = require_tool("kubectl")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@functools.cache
def rendered(overlay: str) -> tuple[dict, ...]:
    return tuple(kustomize(KUBERNETES / "overlays" / overlay))


def one(docs, kind: str, name: str = "aieng") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the openAPIV3Schema of each CRD under crds/."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


class UnknownKind(Exception):
    pass


def validate(doc: dict) -> None:
    """Raise unless ``doc`` is valid, strictly (unknown fields fail), for every version in
    KUBERNETES_VERSIONS, or against its carried CRD; a kind that neither knows raises UnknownKind."""
    import kubernetes_validate

    for version in KUBERNETES_VERSIONS:
        target = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(doc, target, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            schema = crd_schemas().get((doc.get("apiVersion"), doc.get("kind")))
            if schema is None:
                raise UnknownKind(
                    f"no schema for {doc.get('apiVersion')} {doc.get('kind')}: neither a Kubernetes "
                    f"kind nor a CRD carried in {CRDS.relative_to(ROOT)}"
                ) from None
            jsonschema.validate(doc, schema)
            return


@functools.cache
def get_routes() -> frozenset[str]:
    from aieng.server.http.app import create_app
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    app = create_app(Runtime(RuntimeConfig(settings=Settings())), start_runtime=False)
    return frozenset(route.path for route in app.routes if "GET" in getattr(route, "methods", ()))
