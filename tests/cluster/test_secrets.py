"""No secret in the repository, none printed: every tracked file is scanned for
secret-looking literals (passwords inside URIs, password/secret/token assignments, cloud
keys, private keys), and the CLI shows a tracking URI's password as ``***``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# values that are clearly not secrets: placeholders, and the fakes the tests use
PLACEHOLDERS = {"", "***", "change-me", "pass", "password", "pw", "s3cret", "secret", "topsecret", "token"}
# a password given by reference: $VAR, ${VAR…}, Kubernetes' $(VAR), an f-string field {…}, <placeholder>
REFERENCE = re.compile(r"\$\{?[A-Za-z_]\w*|\$\([A-Za-z_]\w*\)|\{[^}]*\}|<[^>]*>")
URI_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^\s/@:'\"]+:([^\s/@'\"]*)@")
ASSIGNMENT = re.compile(
    r"""(?ix)\b[\w.-]*(password|passwd|secret|token|api_key|secret_key)\b\s*[:=]\s*
        (?P<quote>['"]?)(?P<value>[^\s'"#,)]*)(?P=quote)""")
KEYS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN (RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36}\b"),
    "Slack token": re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}"),
}


def _literal(value: str) -> bool:
    """True for a value that is written out (not a placeholder, not a reference)."""
    value = value.strip()
    return value.lower() not in PLACEHOLDERS and not REFERENCE.search(value) and not value.startswith(
        ("os.environ", "secrets.", "self.", "cluster.", "env[", "env.get"))


def findings(text: str) -> list[str]:
    """What in ``text`` looks like a committed secret (``line: why``)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in URI_PASSWORD.finditer(line):
            if _literal(m.group(1)):
                out.append(f"{n}: password in a URI")
        for m in ASSIGNMENT.finditer(line):
            value = m.group("value")
            # a literal of some length; short words are names (`token: str`), calls are code
            if _literal(value) and len(value) >= 8 and "(" not in value and not re.fullmatch(r"[A-Za-z_.]+", value):
                out.append(f"{n}: {m.group(1)} assigned a literal")
        for what, pattern in KEYS.items():
            if pattern.search(line):
                out.append(f"{n}: {what}")
    return out


def tracked_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / n for n in names.decode().split("\0") if n and (ROOT / n).is_file()]


def test_the_scanner_finds_secrets():
    fake_pw = "hunter" + "2hunter2"
    assert findings(f"url: postgresql://nalu:{fake_pw}@db:5432/optuna")
    assert findings(f'MLFLOW_TRACKING_PASSWORD="{fake_pw}"')
    assert findings(f"password = {fake_pw}")
    assert findings("key = " + "AKIA" + "ABCDEFGHIJKLMNOP")
    assert findings("-----BEGIN " + "RSA PRIVATE KEY-----")
    for fine in ("postgresql+psycopg://nalu:${POSTGRES_PASSWORD:?set it}@postgres:5432/optuna",
                 'f"postgresql+psycopg://{DB_USER}:{self.pg_password}@127.0.0.1:{port}/{db}"',
                 "POSTGRES_PASSWORD=change-me", "postgresql://user:***@host/db",
                 "password = os.environ['PW']", "postgresql://$(POSTGRES_USER):$(POSTGRES_PASSWORD)@postgres:5432/db", "token: str = ''", "http://127.0.0.1:5000/health"):
        assert not findings(fine), fine


def test_no_tracked_file_holds_a_secret():
    problems = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        problems += [f"{path.relative_to(ROOT)}:{f}" for f in findings(text)]
    assert not problems, "\n".join(problems)


def test_env_files_are_ignored_by_git_and_docker():
    for name in (".gitignore", ".dockerignore"):
        lines = {line.strip() for line in (ROOT / name).read_text().splitlines()}
        assert ".env" in lines, f".env is not in {name}"
    tracked = {p.relative_to(ROOT).as_posix() for p in tracked_files()}
    assert ".env" not in tracked and ".env.example" in tracked
    check = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert check.returncode == 0, "git does not ignore .env"


@pytest.mark.parametrize("verb", [["status"], ["status", "some-sweep"], ["best", "some-sweep"]])
def test_the_cli_never_prints_a_tracking_password(verb, tmp_path):
    """An unreachable server with credentials in its URI: the error names the server but
    shows the password as ***."""
    password = "pw" + "Xq7zK2"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    proc = subprocess.run([sys.executable, "-m", "service", *verb, "--tracking-uri",
                           f"http://alice:{password}@127.0.0.1:1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    assert "http://alice:***@127.0.0.1:1" in output
    assert password not in output
