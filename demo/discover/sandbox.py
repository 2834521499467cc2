"""A sandbox for model-written programs: each runs once, in a fresh Python process behind a
bubblewrap (`bwrap`) boundary, with its own empty directory as the working directory and
enforced limits.

The boundary, not the program's good manners, is what holds:
- namespaces: its own pid namespace (it sees no host process, and killing the sandbox's first
  process takes every descendant, new sessions included), mount namespace (a tmpfs root holding
  read-only binds of /usr, the Python install and numpy, its own directory at /sandbox and an
  empty /tmp; nothing else of the host exists there), network namespace (no interface but
  a down loopback: no socket reaches anything), IPC and UTS namespaces;
- identity: an unprivileged uid with no capabilities and no_new_privs. Run as root, bwrap
  makes no user namespace (one would map the program back to host root, whom the kernel
  exempts from RLIMIT_NPROC) and the bootstrap drops to a uid of its own for each run; run by
  any other user, bwrap's user namespace maps the program to that user;
- limits: RLIMIT_NPROC (a fork bomb stops at `processes`), RLIMIT_AS (an allocation beyond
  `memory_mb` raises MemoryError), RLIMIT_CPU, RLIMIT_FSIZE, no core files;
- time: the whole sandbox is killed (SIGKILL) at `wall_s`, counted from the call, and its
  pipes are read against the same deadline, so nothing it leaves behind can hold `run()`.

Inside, an audit hook (PEP 578) still refuses sockets, process calls and files outside its
directory, so a careless program fails with a clear message; it is a courtesy, not a boundary.

Where bwrap is missing or cannot make its namespaces, `run()` refuses (SandboxUnavailable)
unless `Limits.allow_weak_sandbox` (the demo's `discover.allow_weak_sandbox: true`) says to run
programs under the audit hook and an `unshare -n` network namespace alone, which native code
gets around: fine for trusted programs on a laptop, not for untrusted models.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from reef.errors import ConfigError

PROGRAM = "program.py"
BOOTSTRAP = "_sandbox_bootstrap.py"
WORKDIR = "/sandbox"  # where its directory is mounted inside the boundary
PACKAGES = ("numpy",)  # what programs may import besides the standard library
MAX_OUTPUT = 64 * 1024
KILL_GRACE_S = 0.3  # after the kill, how long the pipes may take to close
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
INSTALL_HINT = "install bubblewrap (Debian: apt-get install -y bubblewrap)"
# Run as root, each run gets a uid of its own from this range (no account needs to exist):
# RLIMIT_NPROC counts a uid's processes host-wide, so runs at once do not share one budget.
_UIDS = itertools.count()
UID_BASE, UID_SPAN = 200_000, 100_000

# Runs in the child before the program: limits, identity, hooks, then the program's entry.
_BOOTSTRAP = r"""
import importlib.util, json, math, os, resource, sys
entry, uid, nproc, mem, cpu, fsize = sys.argv[1], *map(int, sys.argv[2:7])
for limit, value in ((resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
if uid >= 0:  # root in the sandbox (no user namespace): become nobody in particular
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
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


class SandboxUnavailable(ConfigError):
    """No real boundary can be made here and weak sandboxing was not allowed."""

    code = "sandbox_unavailable"


@dataclass(frozen=True)
class Limits:
    wall_s: float = 20.0
    memory_mb: int = 2048
    file_mb: int = 16
    processes: int = 32  # RLIMIT_NPROC: the program and everything it starts
    # Run under the audit hook alone where bwrap cannot make its namespaces (not a boundary).
    allow_weak_sandbox: bool = False


@dataclass(frozen=True)
class Outcome:
    ok: bool  # exited 0 and printed a result
    result: list | None  # what the entry function returned, as JSON values
    reason: str  # "ok", "timeout after …", "exit code …: <last stderr line>"
    stdout: str
    stderr: str
    seconds: float
    boundary: str  # "bubblewrap", or "weak: …" when allow_weak_sandbox let it run without


def _ancestors(path: Path) -> list[Path]:
    return [p for p in reversed(path.parents) if p != Path("/")]


def _python_paths() -> list[Path]:
    """What the interpreter needs, outside /usr: its install (stdlib, libpython), the venv's
    executable and pyvenv.cfg, and the PACKAGES' directories (with their bundled libraries)."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.base_exec_prefix).resolve()}
    exe = Path(sys.executable)
    paths |= {exe, exe.resolve()}
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    if cfg.exists():
        paths.add(cfg)
    for name in PACKAGES:
        spec = find_spec(name)
        if spec is None or spec.origin is None:
            continue
        package = Path(spec.origin).parent
        paths |= {package, *[p for p in [package.parent / f"{name}.libs"] if p.exists()]}
    usr = Path("/usr")
    out: list[Path] = []
    for p in sorted(paths, key=lambda p: len(p.parts)):
        if usr in (p, *p.parents) or any(q in p.parents or q == p for q in out):
            continue
        out.append(p)
    return out


def _root_fs() -> list[str]:
    """bwrap arguments for the sandbox's file system: a tmpfs root, read-only binds of what
    the interpreter needs, the host's /bin, /lib... links as they are, /proc of its own pid
    namespace, a minimal /dev and an empty /tmp."""
    args = ["--tmpfs", "/", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    # The empty /tmp before the binds: an interpreter installed under /tmp (a checkout or a
    # venv there) is bound on top of it, not hidden by it.
    args += ["--perms", "1777", "--tmpfs", "/tmp"]
    binds = _python_paths()
    made: set[Path] = {Path("/tmp")}
    for path in binds:  # parents as plain 0755 directories, so an unprivileged uid gets through
        for parent in _ancestors(path):
            if parent not in made and not parent.is_symlink():
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for path in binds:
        args += ["--ro-bind", str(path), str(path)]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def _namespaces() -> list[str]:
    if os.geteuid() == 0:
        # No user namespace (see the module's docstring): root's capabilities go, except the
        # two the bootstrap needs to drop to its own uid before the program runs.
        return [
            *("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"),
            *("--unshare-cgroup-try", "--cap-drop", "ALL"),
            *("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"),
        ]
    return ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]


def _bwrap_command(bwrap: str, root: Path) -> list[str]:
    return [
        bwrap,
        *_namespaces(),
        "--die-with-parent",  # the sandbox's init dies with bwrap: one kill takes all
        "--new-session",
        *_root_fs(),
        *("--bind", str(root), WORKDIR, "--chdir", WORKDIR),
        "--",
    ]


@functools.cache
def _probe(bwrap: str | None) -> str | None:
    """Why bwrap cannot run the interpreter behind its boundary here, or None when it can."""
    if bwrap is None:
        return f"bwrap is not on the PATH ({INSTALL_HINT})"
    with tempfile.TemporaryDirectory(prefix="reef-sandbox-probe-") as tmp:
        os.chmod(tmp, 0o755)
        imports = "; ".join(f"import {name}" for name in PACKAGES) or "pass"
        cmd = [*_bwrap_command(bwrap, Path(tmp)), sys.executable, "-I", "-c", imports]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=60, env=_env())
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{bwrap} failed to start: {e}"
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-500:]
        return f"{bwrap} cannot make its namespaces here (exit {done.returncode}: {err})"
    return None


def unavailable() -> str | None:
    """Why no real boundary can be made on this machine, or None when bwrap works."""
    return _probe(shutil.which("bwrap"))


def boundary_for(limits: Limits) -> str:
    """The boundary `run()` will use with these limits; raises SandboxUnavailable where there
    is none and weak sandboxing is not allowed (call it before starting work)."""
    why = unavailable()
    if why is None:
        return "bubblewrap"
    if not limits.allow_weak_sandbox:
        raise SandboxUnavailable(
            f"refusing to run model-written programs without a sandbox boundary: {why}. "
            "Install bubblewrap, or set `discover.allow_weak_sandbox: true` to run them under "
            "an audit hook alone, which native code can get around (trusted programs only)."
        )
    return f"weak: audit hook only ({why})"


@functools.cache
def _weak_network() -> tuple[str, ...]:
    """`unshare -n` (or `-rn` unprivileged) where the kernel allows it, for the weak mode."""
    unshare = shutil.which("unshare")
    for prefix in ((unshare, "-n"), (unshare, "-rn")) if unshare else ():
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def _env(home: str = WORKDIR) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    return env | dict.fromkeys(THREAD_VARS, "1")


def _read(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes, bool]:
    """Both pipes to their end or to the deadline, whichever comes first; at the deadline the
    whole sandbox is killed and the pipes get KILL_GRACE_S more. Returns (out, err, timed
    out). Keeps the last MAX_OUTPUT bytes of each."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe.fileno(), selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    break  # killed, yet something still holds a pipe: stop waiting for it
                timed_out = True
                _kill(proc)
                deadline = time.monotonic() + KILL_GRACE_S
                continue
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                del buf[:-MAX_OUTPUT]
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # Its own session and group: bwrap (whose death takes the pid namespace) and all.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(source: str, entry: str, limits: Limits = Limits()) -> Outcome:
    """Run `source`'s top-level `entry()` in a fresh sandboxed process; its return value comes
    back as JSON (numpy arrays as lists). Raises SandboxUnavailable where no boundary can be
    made and `limits.allow_weak_sandbox` is off."""
    started = time.monotonic()
    deadline = started + limits.wall_s
    boundary = boundary_for(limits)
    with tempfile.TemporaryDirectory(prefix="reef-sandbox-") as tmp:
        root = Path(tmp)
        (root / PROGRAM).write_text(source)
        (root / BOOTSTRAP).write_text(_BOOTSTRAP)
        uid = -1
        if boundary == "bubblewrap":
            if os.geteuid() == 0:
                uid = UID_BASE + (os.getpid() * 64 + next(_UIDS)) % UID_SPAN
                os.chown(root, uid, uid)
            os.chmod(root, 0o755)
            prefix, cwd, env = (
                _bwrap_command(shutil.which("bwrap") or "bwrap", root),
                WORKDIR,
                _env(),
            )
        else:
            prefix, cwd, env = [*_weak_network()], str(root), _env(str(root)) | {"TMPDIR": tmp}
        mb = 1024 * 1024
        numbers = (uid, limits.processes, limits.memory_mb * mb, int(limits.wall_s) + 2)
        argv = [*map(str, (*numbers, limits.file_mb * mb))]
        cmd = [*prefix, sys.executable, "-I", "-B", f"{cwd}/{BOOTSTRAP}", entry, *argv]
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: the kill takes bwrap and all
        )
        with proc:
            out, err, timed_out = _read(proc, deadline)
    return _outcome(
        proc.returncode, out, err, timed_out, time.monotonic() - started, limits, boundary
    )


def _outcome(
    code: int,
    out: bytes,
    err: bytes,
    timed_out: bool,
    seconds: float,
    limits: Limits,
    boundary: str,
) -> Outcome:
    stdout = out.decode(errors="replace")
    stderr = err.decode(errors="replace")
    if timed_out:
        reason = f"timeout after {limits.wall_s:g}s (killed)"
        return Outcome(False, None, reason, stdout, stderr, seconds, boundary)
    if code != 0:
        last = (stderr.strip().splitlines() or [""])[-1][:300]
        why = f"killed by signal {-code}" if code < 0 else "exit code"
        reason = f"{why} {code}: {last}" if code > 0 else why
        return Outcome(False, None, reason, stdout, stderr, seconds, boundary)
    lines = stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])["result"] if lines else None
    except (ValueError, KeyError, TypeError):
        result = None
    if result is None:
        return Outcome(False, None, "no result printed", stdout, stderr, seconds, boundary)
    return Outcome(True, result, "ok", stdout, stderr, seconds, boundary)
