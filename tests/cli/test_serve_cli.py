"""`tailsight serve` argument handling that needs no kernel: password hashing, bad listen
addresses, unknown probes, inconsistent TLS / auth options."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.cli.serve import parse_listen
from tailsight.collector.endpoint import verify_password


def test_hash_password_prints_a_verifiable_hash() -> None:
    result = CliRunner().invoke(app, ["serve", "--hash-password"], input="hunter2\n")
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith("pbkdf2_sha256$")
    assert verify_password("hunter2", line)
    assert not verify_password("hunter3", line)


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9435") == ("127.0.0.1", 9435)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9435") == ("::1", 9435)


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["serve", "--listen", "nowhere"]).exit_code == 2
    assert runner.invoke(app, ["serve", "--probe", "nope"]).exit_code == 2
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    assert runner.invoke(app, ["serve", "--tls-cert", str(cert)]).exit_code == 2  # no key
    assert runner.invoke(app, ["serve", "--basic-auth-user", "u"]).exit_code == 2  # no hash file
    assert runner.invoke(app, ["serve", "--cgroup-allow", "("]).exit_code == 2
