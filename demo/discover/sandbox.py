"""A sandbox for model-written programs: each runs once, in a fresh Python subprocess with one
thread, its own empty temporary directory as the working directory, and enforced limits.

- wall clock: the whole process group is killed (SIGKILL) at `wall_s`; CPU time is capped too;
- memory: RLIMIT_AS (address space), so an allocation beyond it raises MemoryError;
- network: an empty network namespace (`unshare -n`, or `unshare -rn` as an unprivileged user)
  where the kernel allows one — then no socket can reach anything, whatever the program does;
  in any case the bootstrap blocks `import socket` and refuses every socket audit event;
- files: an audit hook (PEP 578, it cannot be removed once installed) refuses opening any path
  outside the temp dir, except reads of the interpreter's own library directories (imports);
  the file size limit caps what it may write there. Spawning processes is refused likewise.

An audit hook is not a security boundary against native code (ctypes is refused after numpy
has loaded, but a determined C extension could get around it): the namespace is the hard
network boundary; run the harness in a container or VM for untrusted models at scale.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROGRAM = "program.py"
BOOTSTRAP = "_sandbox_bootstrap.py"
MAX_OUTPUT = 64 * 1024
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

# Runs in the child before the program: hooks first, then the program's import and its entry.
_BOOTSTRAP = r"""
import importlib.util, json, math, os, sys
ROOT = os.path.realpath(os.getcwd())
READABLE = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix,
    sys.exec_prefix, sys.base_exec_prefix, *sys.path) if p and os.path.isdir(p)}))
import numpy  # loaded before ctypes is refused (numpy's import may touch it)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
REFUSED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.kill",
    "os.killpg", "os.chdir", "os.chroot", "mmap.__new__", "sys.remote_exec")

def _inside(path):
    return path == ROOT or path.startswith(ROOT + os.sep)

def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        real = os.path.realpath(os.fsdecode(path))
        writing = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
        if _inside(real):
            return
        if not writing and any(real == p or real.startswith(p + os.sep) for p in READABLE):
            return
        raise PermissionError(f"sandbox: no file access outside its directory ({path})")
    if event.startswith("socket.") or event in REFUSED or event.startswith("os.spawn"):
        raise PermissionError(f"sandbox: {event} is not allowed")

sys.addaudithook(_hook)
sys.modules["socket"] = None  # `import socket` raises ImportError
sys.modules["_socket"] = None
entry = sys.argv[1]
spec = importlib.util.spec_from_file_location("program", os.path.join(ROOT, "program.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = getattr(module, entry)()
def plain(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x
out = list(result) if isinstance(result, (list, tuple)) else [result]
sys.stdout.write("\n" + json.dumps({"result": [plain(v) for v in out]}) + "\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 20.0
    memory_mb: int = 2048
    file_mb: int = 16


@dataclass(frozen=True)
class Outcome:
    ok: bool  # exited 0 and printed a result
    result: list | None  # what the entry function returned, as JSON values
    reason: str  # "ok", "timeout after …", "exit code …: <last stderr line>"
    stdout: str
    stderr: str
    seconds: float
    network: str  # how the network was cut: "namespace" or "audit hook"


@functools.cache
def network_isolation() -> tuple[str, ...]:
    """The command prefix that gives the child an empty network namespace here, or () when
    the kernel refuses both forms (then the audit hook alone refuses sockets)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for prefix in ((unshare, "-n"), (unshare, "-rn")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def _limit(limits: Limits) -> None:  # in the child, before exec
    mem = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(limits.wall_s) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    size = limits.file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _env(root: Path) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "TMPDIR": str(root), "LANG": "C.UTF-8"}
    return env | dict.fromkeys(THREAD_VARS, "1")


def run(source: str, entry: str, limits: Limits = Limits()) -> Outcome:
    """Run `source`'s top-level `entry()` in a fresh sandboxed subprocess; its return value
    comes back as JSON (numpy arrays as lists)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reef-sandbox-") as tmp:
        root = Path(tmp)
        (root / PROGRAM).write_text(source)
        (root / BOOTSTRAP).write_text(_BOOTSTRAP)
        prefix = network_isolation()
        cmd = [*prefix, sys.executable, "-I", str(root / BOOTSTRAP), entry]
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=_env(root),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: the kill takes everything
            preexec_fn=functools.partial(_limit, limits),
        )
        try:
            out, err = proc.communicate(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
    seconds = time.monotonic() - started
    stdout = out.decode(errors="replace")[-MAX_OUTPUT:]
    stderr = err.decode(errors="replace")[-MAX_OUTPUT:]
    network = "namespace" if prefix else "audit hook"
    if timed_out:
        reason = f"timeout after {limits.wall_s:g}s (killed)"
        return Outcome(False, None, reason, stdout, stderr, seconds, network)
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or [""])[-1][:300]
        why = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "exit code"
        reason = f"{why} {proc.returncode}: {last}" if proc.returncode > 0 else why
        return Outcome(False, None, reason, stdout, stderr, seconds, network)
    lines = stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])["result"] if lines else None
    except (ValueError, KeyError, TypeError):
        result = None
    if result is None:
        return Outcome(False, None, "no result printed", stdout, stderr, seconds, network)
    return Outcome(True, result, "ok", stdout, stderr, seconds, network)
