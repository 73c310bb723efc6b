"""``deploy/systemd/kvstore.service``: ``systemd-analyze verify`` finds nothing to say about it,
``systemd-analyze security`` rates its exposure low, and its command is one ``kvstore`` takes.
``verify`` checks that the command exists, so it runs on a copy whose ``ExecStart`` names this
environment's ``kvstore`` instead of the installed ``/opt/kvstore/bin/kvstore``."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from kvstore.testing.server import kvstore_cmd
from tests.deploy.manifests import DATA_DIR, DEPLOY, parse

UNIT = DEPLOY / "systemd" / "kvstore.service"
INSTALLED = "/opt/kvstore/bin/kvstore"
EXPOSURE = 2.0  # systemd's scale: 0 safest, 10 unprotected; "OK" below 4.5 (this unit: 1.5)


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("no systemd-analyze here (Debian's systemd package): make test installs it")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def unit_here(tmp_path: Path) -> Path:
    """The unit with ``ExecStart`` on this environment's ``kvstore`` script."""
    (script,) = kvstore_cmd()[:1]
    if Path(script).name != "kvstore":
        pytest.fail("no kvstore script in this environment: make test (pip install -e .) makes it")
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(INSTALLED, script))
    return copy


def service_section() -> dict[str, list[str]]:
    """``[Service]`` key -> its values (a key may be given more than once)."""
    values: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_verify_says_nothing(tmp_path: Path) -> None:
    done = analyze("verify", str(unit_here(tmp_path)))
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr)


def test_security_exposure_is_low(tmp_path: Path) -> None:
    done = analyze("security", "--offline=true", f"--threshold={EXPOSURE * 10:g}",
                   str(unit_here(tmp_path)))
    if "--offline" in done.stderr:
        pytest.fail(f"this systemd-analyze has no offline security review: {done.stderr}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_hardening_asked_for() -> None:
    svc = service_section()
    assert svc["User"] == ["kvstore"] and svc["Group"] == ["kvstore"]
    assert svc["ProtectSystem"] == ["strict"] and svc["PrivateTmp"] == ["yes"]
    assert svc["NoNewPrivileges"] == ["yes"]
    assert svc["LoadCredential"] == ["token:/etc/kvstore/token"]
    assert svc["ReadWritePaths"] == [DATA_DIR]
    assert svc["StateDirectory"] == ["kvstore"]  # systemd makes it, owned by the user
    sysusers = (DEPLOY / "systemd" / "kvstore.sysusers").read_text()
    assert "\nu kvstore - " in sysusers


def test_command_is_one_kvstore_takes() -> None:
    (command,) = service_section()["ExecStart"]
    argv = shlex.split(command.replace("%d", "/run/credentials/kvstore.service"))
    assert argv[0] == INSTALLED
    args = parse("kvstore", argv[1:])
    assert args.command == "serve"
    assert args.token_file == "/run/credentials/kvstore.service/token"  # LoadCredential's
    env = dict(v.split("=", 1) for v in service_section()["Environment"])
    assert env["KVSTORE_DATA_DIR"] == DATA_DIR
