# SPDX-License-Identifier: Apache-2.0
"""The kvxfer command from the Python package: `python3 -m kvxfer ARGS` and
the `kvxfer` console script run the C++ tool shipped in the package
(kvxfer/bin/kvxfer; in the build tree a link to build/tools/kvxfer), and
`kvxfer info` names the lanes this host runs."""

import os
import re
import subprocess
import sys

import pytest

import kvxfer
import kvxfer.__main__ as command

TOOL = os.path.join(os.path.dirname(kvxfer.__file__), "bin", "kvxfer")
needs_tool = pytest.mark.skipif(
    not os.access(TOOL, os.X_OK), reason="built without the kvxfer tool (KVXFER_BUILD_TOOLS=OFF)"
)


def python_m_kvxfer(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvxfer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_info_starts_with_where_the_package_comes_from():
    out = python_m_kvxfer("info").stdout
    lines = "".join(f"{key}: {value}\n" for key, value in kvxfer.info().items())
    assert out.startswith(lines)


@needs_tool
def test_python_m_kvxfer_runs_the_packaged_tool_with_its_arguments():
    done = python_m_kvxfer("bench", "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: kvxfer bench [OPTIONS]" in done.stdout
    assert command.tool_path() == TOOL


@needs_tool
def test_the_console_script_runs_the_same_tool():
    # What pip's `kvxfer` script does: kvxfer.__main__:console().
    script = (
        "import sys; from kvxfer.__main__ import console; "
        "sys.argv[1:] = ['demo', '--help']; console()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: kvxfer demo [OPTIONS]" in done.stdout


@needs_tool
def test_without_a_subcommand_the_tool_asks_for_one():
    done = python_m_kvxfer()
    assert done.returncode != 0 and "A subcommand is required" in done.stderr


@needs_tool
def test_info_names_the_tool_and_the_lanes_with_the_tcp_listener():
    done = python_m_kvxfer("info", KVXFER_TCP_ADDRESS="127.0.0.1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"tool: {TOOL}\n" in out
    assert "\nlanes: cma,ucx,tcp (the default)" in out
    assert "\n  cma  on: " in out
    assert "\n  ucx  off: no RDMA device here" in out or "\n  ucx  on: " in out
    assert re.search(r"\n  tcp  on: every other peer; listens on 127\.0\.0\.1:\d+ ", out), out
    assert "address: 127.0.0.1 (KVXFER_TCP_ADDRESS)" in out
    assert re.search(r"\nRDMA devices: ", out)


@needs_tool
def test_info_follows_kvxfer_lanes_from_the_environment():
    out = python_m_kvxfer("info", KVXFER_LANES="cma").stdout
    assert "\nlanes: cma (KVXFER_LANES from the environment)" in out
    assert "\n  ucx  off: not in KVXFER_LANES" in out
    assert "\n  tcp  off: not in KVXFER_LANES" in out


def test_without_a_tool_info_still_prints_and_other_commands_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(command, "tool_path", lambda: None)
    assert command.main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"\ntool: {command._NO_TOOL}\n") and "not installed" in command._NO_TOOL
    assert command.main(["bench"]) == 2
    assert "the kvxfer tool is not installed" in capsys.readouterr().err
