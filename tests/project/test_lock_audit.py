"""The lock audit against a registry on loopback that serves per-project JSON, as the real one does."""

import pytest

from aieng.locks import audit as lock_audit

PROJECTS = {
    "safe": {"info": {"version": "1.0"}, "vulnerabilities": []},
    "leaky": {
        "info": {"version": "2.0"},
        "vulnerabilities": [
            {
                "id": "PYSEC-2099-1",
                "aliases": ["CVE-2099-0001"],
                "fixed_in": ["2.1"],
                "summary": "reads files it should not",
            },
            {"id": "PYSEC-2099-2", "aliases": [], "fixed_in": [], "withdrawn": "2099-01-01"},
        ],
    },
    "old": {"info": {"version": "5.0"}, "vulnerabilities": []},
    "local": {"info": {"version": "2.13.0"}, "vulnerabilities": []},
}


@pytest.fixture
def registry(json_site):
    return json_site({f"pypi/{name}/json": page for name, page in PROJECTS.items()}) + "/pypi"


def _lock(tmp_path, pins: dict[str, str]):
    path = tmp_path / "requirements.lock"
    path.write_text("".join(f"{n}=={v} \\\n    --hash=sha256:{'0' * 64}\n" for n, v in pins.items()))
    return path


def _allow(tmp_path, entries):
    path = tmp_path / "allow.toml"
    path.write_text("".join(f'[[allow]]\nid = "{key}"\nwhy = "{why}"\n\n' for key, why in entries))
    return path


def test_a_known_vulnerability_fails_the_audit_until_it_is_allowed_with_a_reason(registry, tmp_path, capsys):
    lock = _lock(tmp_path, {"safe": "1.0", "leaky": "2.0", "local": "2.13.0+cpu"})
    assert lock_audit.main([str(lock), "--registry", registry, "--allow", str(tmp_path / "none.toml")]) == 1
    out = capsys.readouterr().out
    assert "FAIL     leaky==2.0: PYSEC-2099-1 (CVE-2099-0001) fixed in 2.1" in out
    assert "PYSEC-2099-2" not in out  # withdrawn advisories are not findings
    assert "local" not in out.split("audited")[0]  # a local build is audited as its public release
    allow = _allow(tmp_path, [("PYSEC-2099-1", "not reachable: we never call the file reader")])
    assert lock_audit.main([str(lock), "--registry", registry, "--allow", str(allow)]) == 0
    assert "allowed  leaky==2.0" in capsys.readouterr().out


def test_a_pin_older_than_the_latest_is_unaudited_and_fails_unless_allowed(registry, tmp_path, capsys):
    lock = _lock(tmp_path, {"old": "4.2"})
    assert lock_audit.main([str(lock), "--registry", registry, "--allow", str(tmp_path / "none.toml")]) == 1
    assert "not auditable against this registry: pinned 4.2, latest 5.0" in capsys.readouterr().out
    stale = _allow(tmp_path, [("old==4.2", "5.0 needs Python 3.12"), ("PYSEC-1-1", "fixed long ago")])
    assert lock_audit.main([str(lock), "--registry", registry, "--allow", str(stale)]) == 0
    assert "stale    PYSEC-1-1" in capsys.readouterr().out


def test_an_allowance_without_a_reason_is_refused(tmp_path):
    path = tmp_path / "allow.toml"
    path.write_text('[[allow]]\nid = "PYSEC-2099-1"\nwhy = " "\n')
    with pytest.raises(SystemExit, match="needs an `id` and a `why`"):
        lock_audit.load_allowlist(path)


def test_the_repository_allowlist_gives_every_entry_a_reason():
    from pathlib import Path

    entries = lock_audit.load_allowlist(Path(__file__).resolve().parents[2] / "security" / "audit-allowlist.toml")
    assert entries and all(len(why) > 20 for why in entries.values())
