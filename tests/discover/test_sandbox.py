"""The program sandbox: a fresh process per program behind a real boundary (its own user, pid,
mount and network namespaces, an unprivileged uid, a process limit), killed with everything it
started at its wall limit, and refused where no such boundary can be made."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from demo.discover.sandbox import Limits, SandboxUnavailable, run, unavailable

# The sandboxed program starts processes the way subprocess does but without its audit event
# (what a program that wants out would do), and runs them to their end or leaves them.
SPAWN = """import _posixsubprocess, os


def spawn(argv, setsid=False, stdout=-1):
    args = [os.fsencode(a) for a in argv]
    err_r, err_w = os.pipe()
    pid = _posixsubprocess.fork_exec(
        args, [args[0]], False, (), None, None, -1, -1, -1, stdout, -1, -1, err_r, err_w, True,
        setsid, -1, None, None, None, -1, None, False)
    os.close(err_w)
    failed = os.read(err_r, 200)
    os.close(err_r)
    if failed:
        raise OSError(failed.decode())
    return pid


def sh(command):
    return os.waitpid(spawn(["/bin/sh", "-c", command]), 0)[1]

"""


def leftovers(marker: str) -> list[int]:
    """Host processes whose command line holds `marker`: what outlived a sandbox."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def listener() -> object:
    """A loopback TCP server: reachable from this process, so a refused connection from the
    sandbox is the sandbox's doing. Yields (port, connections accepted)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[object] = []

    def accept() -> None:
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(conn)
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_a_program_runs_and_returns_json() -> None:
    out = run("import numpy as np\n\ndef f():\n    return np.arange(3), 1.5\n", "f")
    assert out.ok and out.result == [[0, 1, 2], 1.5]
    assert out.boundary == "bubblewrap"


def test_socket_import_is_refused(listener: tuple[int, list]) -> None:
    port, accepted = listener
    src = f"def f():\n    import socket\n    socket.create_connection(('127.0.0.1', {port}))\n"
    out = run(src, "f")
    assert not out.ok and "socket" in out.reason and not accepted


def test_no_process_it_starts_reaches_the_network(listener: tuple[int, list]) -> None:
    # A child without the audit hook, plain and in its parent's network namespace (nsenter
    # works for root without a user namespace): the listener must see nothing.
    port, accepted = listener
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    plain = f'{sys.executable} -c "{connect}"'
    src = SPAWN + (
        "def f():\n    net = f'/proc/{os.getppid()}/ns/net'\n"
        f"    return sh({plain!r}), sh('nsenter --net=' + net + ' ' + {plain!r})\n"
    )
    out = run(src, "f", Limits(wall_s=10))
    time.sleep(0.2)
    assert not accepted, out
    assert out.ok and out.result is not None, out
    assert all(status != 0 for status in out.result), out


@pytest.mark.parametrize("path", ["/etc/hostname", "/tmp/reef-sandbox-escape.txt", "../x.txt"])
def test_files_outside_its_dir_are_refused(path: str) -> None:
    for mode in ("r", "w"):
        out = run(f"def f():\n    return open({path!r}, {mode!r}).read()\n", "f")
        assert not out.ok and "no file access outside its directory" in out.reason, out.reason


# A directory fd the audit hook lets it open (the Python install, for imports) and a relative
# path that a symlink inside its own dir makes look local to the hook, while the kernel resolves
# it from that fd to any absolute path on the host.
DIR_FD = """import os, sys


def outside(target, flags):
    base = os.path.realpath(sys.prefix)
    depth = base.count("/")
    deep = os.path.join(*["d"] * (depth + 2))
    os.makedirs(deep)
    os.symlink(deep, "lib")
    fd = os.open(base, os.O_RDONLY)
    return os.open("lib/" + "../" * (depth + 1) + target.lstrip("/"), flags, 0o644, dir_fd=fd)

"""


def test_a_symlink_and_dir_fd_reach_no_file_outside(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    read = DIR_FD + (
        f"def f():\n    return os.read(outside({str(secret)!r}, os.O_RDONLY), 100).decode()\n"
    )
    out = run(read, "f")
    assert not out.ok and "host secret" not in out.stdout + out.stderr, out
    target = tmp_path / "written.txt"
    write = DIR_FD + (
        f"def f():\n    fd = outside({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n"
        "    return os.write(fd, b'escaped')\n"
    )
    out = run(write, "f")
    assert not out.ok and not target.exists(), out


def test_it_sees_no_host_root_and_no_host_process() -> None:
    src = "import os\n\ndef f():\n    return os.listdir('/'), os.listdir('/tmp'), os.listdir('/proc')\n"
    out = run(src, "f")
    assert out.ok and out.result is not None, out.reason
    root, tmp, proc = out.result
    assert not {"etc", "home", "var", "opt", "srv", "run", "boot"} & set(root), root
    # /tmp is empty but for the read-only way to an interpreter installed under it (a clone
    # or a venv in /tmp)
    under_tmp = {
        Path(p).parts[2]
        for p in (sys.prefix, sys.base_prefix, sys.executable)
        if Path(p).parts[:2] == ("/", "tmp") and len(Path(p).parts) > 2
    }
    assert set(tmp) <= under_tmp, tmp
    assert len([p for p in proc if p.isdigit()]) <= 3, proc  # its init, itself


def test_its_own_dir_is_writable_and_processes_are_refused() -> None:
    src = "def f():\n    open('a.txt', 'w').write('x')\n    return open('a.txt').read()\n"
    assert run(src, "f").result == ["x"]
    out = run("import os\n\ndef f():\n    return os.system('true')\n", "f")
    assert not out.ok and "os.system is not allowed" in out.reason
    out = run("import subprocess\n\ndef f():\n    return subprocess.run(['true'])\n", "f")
    assert not out.ok and "not allowed" in out.reason


def test_processes_it_starts_anyway_run_unprivileged() -> None:
    src = SPAWN + "def f():\n    sh('id -u > uid.txt')\n    return open('uid.txt').read().strip()\n"
    out = run(src, "f")
    assert out.ok and out.result != ["0"], out


def test_a_fork_bomb_stops_at_its_process_limit() -> None:
    marker = f"77{os.getpid()}"
    src = SPAWN + (
        "def f():\n    started = 0\n    for _ in range(200):\n        try:\n"
        f"            spawn(['/bin/sh', '-c', 'sleep 10; : {marker}'])\n        except OSError:\n"
        "            break\n        started += 1\n    return started\n"
    )
    out = run(src, "f", Limits(wall_s=10, processes=16))
    assert out.ok and out.result is not None and out.result[0] < 16, out
    time.sleep(0.2)
    assert leftovers(marker) == []


@pytest.mark.parametrize("sleep", ["4", "inf"])
def test_a_detached_child_dies_with_it_at_the_wall_limit(sleep: str) -> None:
    # A new session is out of the program's process group (what killpg takes); it holds the
    # output pipes, so a run that waits for their end waits for it.
    marker = f"{sleep}{os.getpid()}"
    src = SPAWN + (
        f"def f():\n    spawn(['/bin/sh', '-c', 'sleep {sleep}; : {marker}'], setsid=True)\n"
        "    while True:\n        pass\n"
    )
    started = time.monotonic()
    out = run(src, "f", Limits(wall_s=2.0))
    took = time.monotonic() - started
    assert not out.ok and out.reason.startswith("timeout after 2s")
    assert 1.5 <= took <= 2.5 and 1.5 <= out.seconds <= 2.5, (took, out.seconds)
    time.sleep(0.2)
    assert leftovers(marker) == []


def test_a_detached_child_dies_when_the_program_returns() -> None:
    marker = f"inf{os.getpid()}9"
    src = SPAWN + (
        f"def f():\n    spawn(['/bin/sh', '-c', 'sleep inf; : {marker}'], setsid=True)\n"
        "    return 1\n"
    )
    started = time.monotonic()
    out = run(src, "f", Limits(wall_s=20.0))
    # its end, not the child's (never) nor the wall limit's: slack for a loaded machine
    assert out.ok and out.result == [1] and time.monotonic() - started < 8, out
    time.sleep(0.2)
    assert leftovers(marker) == []


def test_a_runaway_is_killed_at_its_wall_limit() -> None:
    started = time.monotonic()
    out = run("def f():\n    while True:\n        pass\n", "f", Limits(wall_s=2.0))
    assert not out.ok and out.reason.startswith("timeout after 2s")
    assert 1.5 <= time.monotonic() - started <= 2.5


def test_memory_beyond_the_limit_fails() -> None:
    src = "def f():\n    b = bytearray(1_500 * 1024 * 1024)\n    return len(b)\n"
    out = run(src, "f", Limits(memory_mb=1024))
    assert not out.ok and "MemoryError" in out.reason


def test_without_a_boundary_it_refuses_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on the PATH
    assert "bwrap" in (unavailable() or "")
    with pytest.raises(SandboxUnavailable, match=r"discover\.allow_weak_sandbox"):
        run("def f():\n    return 1\n", "f")
    out = run("def f():\n    return 1\n", "f", Limits(allow_weak_sandbox=True))
    assert out.ok and out.result == [1] and out.boundary.startswith("weak")


def test_the_demo_refuses_to_start_without_a_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from demo.discover.__main__ import main
    from demo.discover.settings import load

    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["--state-dir", str(tmp_path / "run")]) == 2  # before any server starts
    err = capsys.readouterr().err
    assert "bwrap is not on the PATH" in err and "discover.allow_weak_sandbox: true" in err
    config = tmp_path / "discover.yaml"
    config.write_text("discover:\n  allow_weak_sandbox: true\n")
    assert load(config).allow_weak_sandbox and not load(None).allow_weak_sandbox
