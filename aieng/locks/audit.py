"""Audit a lock file for known vulnerabilities against the package registry: ``make audit``.

Why not pip-audit: it asks PyPI's per-release JSON (``/pypi/NAME/VERSION/json``), which the
registry this project builds from does not serve; the per-project JSON (``/pypi/NAME/json``) it
does serve lists the advisories (``vulnerabilities``: id, aliases, fixed_in) that affect the
project's latest release. So:

- a pin that *is* the latest release is audited exactly: every advisory listed is a finding;
- a pin older than the latest cannot be audited here, and is a finding too ("unaudited"), so
  nothing passes silently: pin the latest, or allow it with a reason.

Findings fail the audit unless the allow-list (``security/audit-allowlist.toml``) has an entry
for the advisory id (or for ``NAME==VERSION`` when unaudited) with a non-empty ``why``. An entry
whose finding has gone away is reported as stale, so the list shrinks when it can.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx

from aieng.locks.lockfile import read_lock

REGISTRY = "https://pypi.org/pypi"


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    key: str  # the advisory id, or NAME==VERSION for an unaudited pin
    detail: str


def registry_facts(name: str, registry: str = REGISTRY, client: httpx.Client | None = None) -> tuple[str, list[dict]]:
    """(the project's latest version, the advisories that affect it) from the registry."""
    client = client or httpx.Client(timeout=30)
    resp = client.get(f"{registry}/{name}/json")
    resp.raise_for_status()
    data = resp.json()
    return data["info"]["version"], list(data.get("vulnerabilities") or [])


def audit(pins: dict[str, str], facts: dict[str, tuple[str, list[dict]]]) -> list[Finding]:
    """Findings for ``pins`` given each package's ``(latest, advisories)``."""
    findings = []
    for name, version in sorted(pins.items()):
        latest, advisories = facts[name]
        public = version.split("+", 1)[0]  # a local build (torch 2.13.0+cpu) is the release it was built from
        if public != latest:
            findings.append(
                Finding(
                    name,
                    version,
                    f"{name}=={version}",
                    f"not auditable against this registry: pinned {version}, latest {latest}",
                )
            )
            continue
        for advisory in advisories:
            if advisory.get("withdrawn"):
                continue
            aliases = ", ".join(advisory.get("aliases") or [])
            fixed = ", ".join(advisory.get("fixed_in") or []) or "no fixed release"
            findings.append(
                Finding(
                    name,
                    version,
                    advisory["id"],
                    f"{advisory['id']} ({aliases}) fixed in {fixed}: {advisory.get('summary') or ''}".strip(),
                )
            )
    return findings


def load_allowlist(path: Path) -> dict[str, str]:
    """``{key: why}``; an entry without a reason is an error, not an allowance."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("allow", [])
    allowed = {}
    for entry in entries:
        key, why = entry.get("id", ""), (entry.get("why") or "").strip()
        if not key or not why:
            raise SystemExit(f"{path}: every [[allow]] entry needs an `id` and a `why` (got {entry})")
        allowed[key] = why
    return allowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aieng.locks.audit", description=__doc__.splitlines()[0])
    parser.add_argument("lock", nargs="+", type=Path, help="lock files (locks/*.lock)")
    parser.add_argument(
        "--allow",
        type=Path,
        default=Path("security/audit-allowlist.toml"),
        help="allow-list: [[allow]] id = ADVISORY or NAME==VERSION, why = ...",
    )
    parser.add_argument("--registry", default=REGISTRY, help="the registry's JSON API root")
    args = parser.parse_args(argv)
    pins: dict[str, str] = {}
    for lock in args.lock:
        pins.update(read_lock(lock))
    with httpx.Client(timeout=30) as client, concurrent.futures.ThreadPoolExecutor(16) as pool:
        facts = dict(zip(pins, pool.map(lambda n: registry_facts(n, args.registry, client), pins)))
    findings = audit(pins, facts)
    allowed = load_allowlist(args.allow)
    blocking = [f for f in findings if f.key not in allowed]
    for f in findings:
        mark = "allowed" if f.key in allowed else "FAIL"
        print(
            f"{mark:8} {f.package}=={f.version}: {f.detail}" + (f" [why: {allowed[f.key]}]" if f.key in allowed else "")
        )
    for key in sorted(set(allowed) - {f.key for f in findings}):
        print(f"stale    {key}: allowed in {args.allow} but no longer found; remove the entry")
    print(f"audited {len(pins)} pins against {args.registry}: {len(findings)} finding(s), {len(blocking)} not allowed")
    return 1 if blocking else 0


if __name__ == "__main__":
    raise SystemExit(main())
