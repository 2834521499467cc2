"""The program sandbox: a fresh process per program that cannot reach the network or files
outside its temp dir, and that is killed at its limits."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from demo.discover.sandbox import Limits, network_isolation, run


@pytest.fixture
def listener() -> object:
    """A loopback TCP server: reachable from this process, so a refused connection from the
    sandbox is the sandbox's doing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[object] = []

    def accept() -> None:
        try:
            conn, _ = server.accept()
            accepted.append(conn)
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_program_runs_and_returns_json() -> None:
    out = run("import numpy as np\n\ndef f():\n    return np.arange(3), 1.5\n", "f")
    assert out.ok and out.result == [[0, 1, 2], 1.5]


def test_socket_import_is_refused(listener: int) -> None:
    src = f"def f():\n    import socket\n    socket.create_connection(('127.0.0.1', {listener}))\n"
    out = run(src, "f")
    assert not out.ok and "socket" in out.reason


def test_getting_around_the_import_block_is_still_refused(listener: int) -> None:
    # Undo the import block: the audit hook (and the namespace, where there is one) still stop it.
    src = (
        "import sys\n\ndef f():\n    sys.modules.pop('socket', None)\n"
        "    sys.modules.pop('_socket', None)\n    import importlib\n"
        "    s = importlib.import_module('socket')\n"
        f"    s.create_connection(('127.0.0.1', {listener}), timeout=2)\n    return 1\n"
    )
    out = run(src, "f")
    assert not out.ok
    assert any(w in out.reason for w in ("socket", "not allowed", "Permission", "refused"))


def test_the_network_namespace_has_no_route(listener: int) -> None:
    prefix = network_isolation()
    if not prefix:
        pytest.skip("this kernel refuses network namespaces; the audit hook alone applies")
    code = f"import socket; socket.create_connection(('127.0.0.1', {listener}), timeout=2)"
    done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True)
    err = done.stderr.lower()
    assert done.returncode != 0 and (b"refused" in err or b"unreachable" in err), err
    assert run("def f():\n    return 1\n", "f").network == "namespace"


@pytest.mark.parametrize("path", ["/etc/hostname", "/tmp/reef-sandbox-escape.txt", "../x.txt"])
def test_files_outside_its_dir_are_refused(path: str) -> None:
    for mode in ("r", "w"):
        out = run(f"def f():\n    return open({path!r}, {mode!r}).read()\n", "f")
        assert not out.ok and "no file access outside its directory" in out.reason, out.reason


def test_its_own_dir_is_writable_and_processes_are_refused() -> None:
    src = "def f():\n    open('a.txt', 'w').write('x')\n    return open('a.txt').read()\n"
    assert run(src, "f").result == ["x"]
    out = run("import os\n\ndef f():\n    return os.system('true')\n", "f")
    assert not out.ok and "os.system is not allowed" in out.reason
    out = run("import subprocess\n\ndef f():\n    return subprocess.run(['true'])\n", "f")
    assert not out.ok and "not allowed" in out.reason


def test_a_runaway_is_killed_at_its_wall_limit() -> None:
    started = time.monotonic()
    out = run("def f():\n    while True:\n        pass\n", "f", Limits(wall_s=2.0))
    assert not out.ok and out.reason.startswith("timeout after 2s")
    assert time.monotonic() - started < 10


def test_memory_beyond_the_limit_fails() -> None:
    src = "def f():\n    b = bytearray(1_500 * 1024 * 1024)\n    return len(b)\n"
    out = run(src, "f", Limits(memory_mb=1024))
    assert not out.ok and "MemoryError" in out.reason
