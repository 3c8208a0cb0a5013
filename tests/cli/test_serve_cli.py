"""`tailsight serve` argument handling that needs no kernel: password hashing, bad listen
addresses, unknown probes, inconsistent TLS / auth options."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.cli.serve import parse_listen
from tailsight.cli.wiring import build_agent, is_loopback
from tailsight.collector.config import CollectorConfig
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


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("metrics.example.com")  # a name may resolve anywhere


def test_plain_password_in_hash_file_exit_2(tmp_path: Path) -> None:
    """A file holding the password itself, not its hash, is bad input."""
    plain = tmp_path / "password"
    plain.write_text("hunter2\n")
    argv = ["serve", "--probe", "runqueue", "--basic-auth-user", "prom"]
    result = CliRunner().invoke(app, [*argv, "--basic-auth-hash-file", str(plain)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert "pbkdf2_sha256" in result.output and "--hash-password" in result.output
    assert "hunter2" not in result.output  # the secret is not echoed
    directory = tmp_path / "dir"
    directory.mkdir()
    result = CliRunner().invoke(app, [*argv, "--basic-auth-hash-file", str(directory)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output


def test_unloadable_tls_files_exit_2(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    argv = ["serve", "--probe", "runqueue", "--tls-cert", str(cert), "--tls-key", str(key)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "cannot load" in result.output


def test_record_group_unknown_exit_2_and_known_group_readable(tmp_path: Path) -> None:
    """`serve --record-group` as `record --group`: an unknown group is bad input; a known one
    makes the recording 0750 / 0640 and owned by that group (the writer is built unattached)."""
    import grp
    import stat

    result = CliRunner().invoke(
        app, ["serve", "--record", str(tmp_path / "r"), "--record-group", "no-such-group-x"]
    )
    assert result.exit_code == 2 and "no-such-group-x" in result.output
    assert not (tmp_path / "r").exists()
    config = CollectorConfig(record_dir=tmp_path / "rec", record_group="daemon")
    agent = build_agent(config, log=lambda m: None, export=True)
    assert agent.writer is not None
    agent.writer.close()
    info = (tmp_path / "rec").stat()
    assert stat.S_IMODE(info.st_mode) == 0o750
    assert info.st_gid == grp.getgrnam("daemon").gr_gid


@pytest.mark.kernel
def test_cgroup_root_that_does_not_exist_is_bad_input(kernel_ready: None) -> None:
    result = CliRunner().invoke(app, ["serve", "--cgroup-root", "/tailsight-no-such-cgroup"])
    assert result.exit_code == 2, result.output
    assert "no cgroup /tailsight-no-such-cgroup under" in " ".join(result.output.split())
