"""Env files: format, errors naming file and line, lookup order and precedence, what gets exported."""
import pytest

from dsfast.launcher.envfile import env_file_candidates, exported_env, parse_env_text, read_env_files
from dsfast.launcher.errors import LaunchError
from launcher_util import dry

TRICKY = """it's "a" value; echo PWNED $(id) `id` && rm -rf /nonexistent"""


def test_format_accepts_comments_blanks_export_and_keeps_values_literal():
    text = ("# comment\n\n  NCCL_IB_DISABLE=1\nexport NCCL_SOCKET_IFNAME=eth0\n"
            f"MSG={TRICKY}\nQ1=\"double quoted\"\nQ2='single quoted'\nEQ=a=b=c\nEMPTY=\n  SP =  x y  \n")
    assert dict(parse_env_text(text, "f")) == {
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "MSG": TRICKY, "Q1": "double quoted",
        "Q2": "single quoted", "EQ": "a=b=c", "EMPTY": "", "SP": "x y"}


@pytest.mark.parametrize("line", ["NOEQUALS", "=value", "1KEY=v", "BAD-KEY=v", "A B=c", "export =x"])
def test_malformed_line_names_file_and_line(line):
    with pytest.raises(LaunchError) as e:
        parse_env_text(f"OK=1\n# c\n{line}\n", "/x/.deepspeed_env")
    assert f"env file /x/.deepspeed_env line 3 ({line!r})" in str(e.value)


def test_lookup_order_and_precedence(tmp_path):
    cwd, home = tmp_path / "cwd", tmp_path / "home2"
    cwd.mkdir(), home.mkdir()
    explicit = tmp_path / "explicit.env"
    explicit.write_text("A=explicit\nB=explicit\nC=explicit\nD=explicit\nE=explicit\n")
    (home / ".deepspeed_env").write_text("B=home-ds\nC=home-ds\nD=home-ds\nE=home-ds\n")
    (home / ".dsfast_env").write_text("C=home-dsfast\nD=home-dsfast\nE=home-dsfast\n")
    (cwd / ".deepspeed_env").write_text("D=cwd-ds\nE=cwd-ds\n")
    (cwd / ".dsfast_env").write_text("E=cwd-dsfast\n")
    environ = {"DS_ENV_FILE": str(explicit)}
    assert env_file_candidates(str(cwd), str(home), environ) == [
        str(explicit), str(home / ".deepspeed_env"), str(home / ".dsfast_env"),
        str(cwd / ".deepspeed_env"), str(cwd / ".dsfast_env")]
    merged, read = read_env_files(str(cwd), str(home), environ)
    assert dict(merged) == {"A": "explicit", "B": "home-ds", "C": "home-dsfast", "D": "cwd-ds", "E": "cwd-dsfast"}
    assert len(read) == 5


def test_same_file_read_once_and_missing_explicit_is_an_error(tmp_path):
    (tmp_path / ".deepspeed_env").write_text("A=1\n")
    merged, read = read_env_files(str(tmp_path), str(tmp_path), {})  # cwd == home
    assert dict(merged) == {"A": "1"} and read == [str(tmp_path / ".deepspeed_env")]
    with pytest.raises(LaunchError, match="DS_ENV_FILE=.*does not exist"):
        read_env_files(str(tmp_path), str(tmp_path), {"DS_ENV_FILE": str(tmp_path / "missing")})


def test_exported_env_prefixes_and_file_override():
    environ = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/p", "HOME": "/root", "UCX_TLS": "tcp", "SECRET": "x",
               "MLFLOW_X": "1", "MV2_Y": "2"}
    out = exported_env(environ, {"NCCL_DEBUG": "WARN", "MSG": "m"})
    assert out == {"MLFLOW_X": "1", "MV2_Y": "2", "NCCL_DEBUG": "WARN", "PYTHONPATH": "/p", "UCX_TLS": "tcp",
                   "MSG": "m"}


def test_env_reaches_the_plan_and_errors_exit_2(tmp_path, capsys):
    (tmp_path / ".deepspeed_env").write_text(f"MSG={TRICKY}\n")
    rc, plan, _ = dry(["train.py"], capsys)
    assert rc == 0 and plan["env"]["MSG"] == TRICKY
    (tmp_path / ".dsfast_env").write_text("fine=1\nnot a line\n")
    rc, _, err = dry(["train.py"], capsys)
    assert rc == 2 and f"env file {tmp_path / '.dsfast_env'} line 2 ('not a line')" in err
