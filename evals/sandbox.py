"""Run untrusted, model-written Python where it can see and harm nothing: `run(files, argv, limits)`.

The confinement is bubblewrap's (Debian's `bubblewrap`, installed by `make sysdeps`), not ours:
- new mount, PID, network, IPC and UTS namespaces: no route anywhere, a private /proc that shows only the
  run's own processes (no other command line, no environment), `--die-with-parent`, `--new-session`;
- a filesystem of nothing but the interpreter, read-only (/usr, plus the interpreter's prefix when it
  lives elsewhere) and the bootstrap files: no /etc, no /home, no repository, nothing under RTRL_HOME;
- one size-capped tmpfs over /tmp that holds the working dir (/tmp/sandbox) and all the program may
  write, another small one over /dev/shm; /var/tmp points into /tmp;
- no_new_privs, and a throw-away uid (started as root; evals/_jail.py drops to it after writing the files)
  so no file of the host is the program's and RLIMIT_NPROC counts only this run;
- rlimits per process (CPU, address space, file size, processes, open files, no core), and a cgroup for
  the whole tree (memory and pids) where the host lets us make one (evals/cgroup.py says what holds
  where it does not);
- a wall-clock timeout; then the process group, the PID namespace and the cgroup are killed.
Where bubblewrap is missing, nothing runs: the result is an `error` that says so (no weaker fallback).

Verdicts never come from inside: evals/judge.py runs hidden tests in a process of its own and talks to
the program only in plain data. `result.isolation` lists what was in force.

CLI: `python -m evals.sandbox FILE.py [--timeout S]` prints the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evals.cgroup import TreeCap

HERE = Path(__file__).parent
BOOT = {"/rtrl/_jail.py": HERE / "_jail.py", "/rtrl/_serve.py": HERE / "_serve.py", "/rtrl/_wire.py": HERE / "_wire.py"}
WORKDIR = "/tmp/sandbox"
SETUP_FAILED = 121
TAIL = 4000  # characters of stdout/stderr kept in a result
STATUSES = ("passed", "failed", "timeout", "killed", "error")
KILL_SIGNALS = {signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT}


class SandboxUnavailable(RuntimeError):
    """bubblewrap is not installed or cannot make namespaces here: model code is not run at all."""


@dataclass
class Limits:
    """What one run may use. Defaults fit a unit-test run of a small repository."""

    timeout_s: float = 10.0
    memory_mb: int = 1024  # RLIMIT_AS per process, and the cgroup cap for the whole tree
    fsize_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write (stdout/stderr included)
    nproc: int = 16  # RLIMIT_NPROC for the run's own uid, and pids.max for the tree
    nofile: int = 64
    tmp_mb: int = 32  # the tmpfs over /tmp: the working dir and every file the program writes, together

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "fsize_mb", "nproc", "nofile", "tmp_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    status: str  # passed | failed | timeout | killed | error
    returncode: int | None
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    isolation: list[str] = field(default_factory=list)
    uid: int | None = None  # the throw-away uid the program ran as (None when not started as root)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def bwrap() -> str:
    """bubblewrap's path: RTRL_BWRAP if set (it must exist), else `bwrap` on PATH or in /usr/bin."""
    explicit = os.environ.get("RTRL_BWRAP")
    path = explicit if explicit and Path(explicit).is_file() else None
    if not explicit:
        path = shutil.which("bwrap") or ("/usr/bin/bwrap" if Path("/usr/bin/bwrap").is_file() else None)
    if not path:
        raise SandboxUnavailable("bubblewrap is not installed (`apt-get install bubblewrap`, or `make sysdeps`): "
                                 "model-written code is not run unconfined")
    return path


def sandbox_python() -> str:
    """The interpreter for sandboxed code (stdlib only, run -I -S): RTRL_SANDBOX_PYTHON, else the system's."""
    for cand in (os.environ.get("RTRL_SANDBOX_PYTHON"), "/usr/bin/python3", sys.executable):
        if cand and Path(cand).is_file():
            return os.path.realpath(cand)
    raise SandboxUnavailable("no python interpreter for the sandbox; set RTRL_SANDBOX_PYTHON")


def _system_binds(python: str) -> list[str]:
    """/usr read-only, the merged-usr links as the host has them, and the interpreter's prefix if elsewhere."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    prefix = Path(python).parents[1]
    if not str(prefix).startswith("/usr/") and str(prefix) not in ("/", "/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


def bwrap_argv(python: str, limits: Limits, conf_fd: int) -> list[str]:
    """The bwrap command line that starts evals/_jail.py (as root inside, when we are root) in fresh namespaces."""
    mb = 1024 * 1024
    args = [bwrap(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            *_system_binds(python), "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp_mb * mb), "--tmpfs", "/tmp", "--chmod", "1777", "/tmp",
            "--size", str(mb), "--tmpfs", "/dev/shm", "--chmod", "1777", "/dev/shm",
            "--dir", "/var", "--symlink", "../tmp", "/var/tmp", "--dir", "/rtrl"]
    if os.geteuid() != 0:
        args += ["--unshare-user"]  # unprivileged: a user namespace; no throw-away uid
    for inside, host in BOOT.items():
        args += ["--ro-bind", str(host), inside]
    return [*args, "--chdir", "/", python, "-I", "-S", "/rtrl/_jail.py", str(conf_fd)]


def _fresh_uid() -> int:
    return 200_000 + secrets.randbelow(1_000_000_000)  # a uid no account uses: RLIMIT_NPROC reaches only this run


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL * 4))
            return f.read().decode("utf-8", "replace")[-TAIL:]
    except OSError:
        return ""


def check_paths(files: dict[str, str | bytes]) -> None:
    """Refuse a work-dir path that is absolute, climbs with '..' or holds a NUL (host side; _jail.py checks again)."""
    for rel in files:
        parts = Path(rel).parts
        if not rel or rel.startswith("/") or ".." in parts or "\x00" in rel:
            raise ValueError(f"file path {rel!r} escapes the sandbox dir")


class Confined:
    """One started sandbox: the program runs until it exits, `wait` times it out, or `kill` ends it."""

    def __init__(self, files: dict[str, str | bytes], argv: list[str], limits: Limits, mode: str = "run",
                 pass_fds: tuple[int, ...] = (), extra: dict | None = None):
        check_paths(files)
        self.limits, self.t0 = limits, time.monotonic()
        self.uid = _fresh_uid() if os.geteuid() == 0 else None
        python = sandbox_python()
        self.dir = Path(tempfile.mkdtemp(prefix="rtrl-sbx-"))  # 0700, ours: the program's stdout/stderr land here
        self.cap = TreeCap.make(limits.memory_mb, limits.nproc + 4)  # + bwrap's two processes and the bootstrap
        self.isolation = ["bwrap:mount+pid+net+ipc+uts", "private-proc", "tmpfs", "no_new_privs", "rlimits",
                          "uid" if self.uid is not None else "userns"] + (["cgroup"] if self.cap.active else [])
        conf_r, conf_w = os.pipe()
        conf = {"mode": mode, "argv": argv, "uid": self.uid, "workdir": WORKDIR, "cpu_s": int(limits.timeout_s) + 1,
                "memory_mb": limits.memory_mb, "fsize_mb": limits.fsize_mb, "nproc": limits.nproc,
                "nofile": limits.nofile + len(pass_fds), **(extra or {}),
                "env": {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
                        "PYTHONDONTWRITEBYTECODE": "1"},
                "files": {k: (v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in files.items()},
                "binary": sorted(k for k, v in files.items() if isinstance(v, bytes))}
        try:
            with open(self.dir / "stdout", "wb") as out, open(self.dir / "stderr", "wb") as err:
                self.proc = subprocess.Popen(
                    self.cap.wrap(bwrap_argv(python, limits, conf_r)), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, start_new_session=True, pass_fds=(conf_r, *pass_fds), env={"PATH": "/usr/bin:/bin"})
        except BaseException:
            os.close(conf_w)
            self._cleanup()
            raise
        finally:
            os.close(conf_r)
        try:
            with os.fdopen(conf_w, "wb") as f:
                f.write(json.dumps(conf).encode())
        except BrokenPipeError:
            pass  # bwrap failed before reading: its exit status and stderr say why


    def wait(self, timeout: float | None = None) -> SandboxResult:
        timed_out = False
        try:
            rc = self.proc.wait(timeout=self.limits.timeout_s if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            rc = self.proc.wait()
        duration = time.monotonic() - self.t0
        oom = self.cap.oom_killed()
        self.kill()
        status = "timeout" if timed_out else _status(rc, oom)
        res = SandboxResult(status, rc, round(duration, 3), _tail(self.dir / "stdout"), _tail(self.dir / "stderr"),
                            self.isolation, self.uid)
        self._cleanup()
        return res

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.cap.close()

    def _cleanup(self) -> None:
        self.cap.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _status(rc: int, oom: bool) -> str:
    if rc == 0 and not oom:
        return "passed"
    if rc == SETUP_FAILED:
        return "error"
    if oom or rc < 0 or (rc > 128 and rc - 128 in KILL_SIGNALS):
        return "killed"  # a signal: a limit (SIGKILL, SIGXCPU, SIGXFSZ), the cgroup's OOM killer, or its own doing
    return "failed"


def run(files: dict[str, str | bytes], argv: list[str], limits: Limits | None = None,
        cwd_on_path: bool = True) -> SandboxResult:
    """Write `files` into a fresh working dir and run `python argv[0] argv[1:]` there, confined."""
    limits = limits or Limits()
    if not argv or argv[0] not in files:
        raise ValueError(f"argv[0] must be one of the files given, got {argv[:1]!r}")
    try:
        box = Confined(files, argv, limits, extra={"cwd_on_path": cwd_on_path})
    except SandboxUnavailable as exc:
        return SandboxResult("error", None, 0.0, "", str(exc), [], None)
    return box.wait()


def run_file(path: str | Path, limits: Limits | None = None) -> SandboxResult:
    path = Path(path)
    return run({path.name: path.read_text()}, [path.name], limits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.sandbox", description="run one program in the sandbox")
    ap.add_argument("file", help="a Python program")
    ap.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds (default 10)")
    ap.add_argument("--memory-mb", type=int, default=1024)
    args = ap.parse_args(argv)
    if not Path(args.file).is_file():
        print(f"no such file: {args.file}", file=sys.stderr)
        return 2
    res = run_file(args.file, Limits(timeout_s=args.timeout, memory_mb=args.memory_mb))
    print(res.to_json())
    return 0 if res.passed else 1


if __name__ == "__main__":
    sys.exit(main())
