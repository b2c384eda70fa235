"""Run untrusted, model-written Python where it can harm nothing: `run(files, argv, limits) -> SandboxResult`.

Each run gets a fresh temp dir (the program's cwd, seen as /tmp/sandbox), a throw-away uid that owns
nothing else, a private network namespace (no route anywhere), private tmpfs over /tmp, /var/tmp and
/dev/shm, and rlimits on CPU, address space, file size, processes and open files; a wall-clock timeout
kills it. Afterwards every process of that uid is killed (a fork bomb's orphans too) and the dir is removed.
The confinement itself is done by evals/_jail.py in the child, see there.

Fallback (documented in evals/README.md): where the host refuses namespaces or we are not root, the
child installs an audit hook refusing sockets and writes outside its dir; `isolation` in the result
says which mechanisms were in force, so a report never overstates them.

CLI: `python -m evals.sandbox FILE.py [--timeout S]` prints the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

JAIL = Path(__file__).with_name("_jail.py")
SETUP_FAILED = 121
TAIL = 4000  # characters of stdout/stderr kept in a result
STATUSES = ("passed", "failed", "timeout", "killed", "error")


@dataclass
class Limits:
    """What one run may use. Defaults fit a unit-test run of a small repository."""

    timeout_s: float = 10.0
    memory_mb: int = 1024  # RLIMIT_AS: a 10 GB allocation raises MemoryError
    fsize_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write (stdout/stderr included)
    nproc: int = 16  # RLIMIT_NPROC for the run's own uid: caps a fork bomb
    nofile: int = 64
    tmp_mb: int = 16  # size of the private tmpfs over /tmp
    force_fallback: bool = False  # tests: exercise the audit-hook fallback even where namespaces work

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
    files: dict[str, str] = field(default_factory=dict)  # files the caller asked to read back
    uid: int | None = None  # the throw-away uid the program ran as (None when not started as root)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _world_executable(path: Path) -> bool:
    """True when any uid can run this interpreter (every ancestor dir traversable by others)."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            mode = d.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def sandbox_python() -> str:
    """The interpreter for sandboxed code: RTRL_SANDBOX_PYTHON, else ours when a dropped uid can run it,
    else the system python3 (ours may live under /root, unreadable to the throw-away uid)."""
    explicit = os.environ.get("RTRL_SANDBOX_PYTHON")
    if explicit:
        return explicit
    for cand in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        if cand and (os.geteuid() != 0 or _world_executable(Path(cand))):
            return cand
    raise RuntimeError("no python interpreter usable by an unprivileged uid; set RTRL_SANDBOX_PYTHON")


def _fresh_uid() -> int:
    # a uid no account uses: its process count (RLIMIT_NPROC) and kill(-1) reach only this run
    return 200_000 + secrets.randbelow(1_000_000_000)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL * 4))
            return f.read().decode("utf-8", "replace")[-TAIL:]
    except OSError:
        return ""


def _uid_pids(uid: int) -> list[int]:
    """Live (non-zombie) processes running as uid, from /proc."""
    pids = []
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            with open(f"/proc/{d.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 0").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(d.name))
    return pids


def _kill_uid(uid: int) -> None:
    """Kill every process still running as `uid` (a fork bomb's orphans too).

    kill(-1) sent *from* that uid reaches exactly its processes; it is repeated while /proc still shows
    some, because a fork bomb refills freed slots between two sweeps. No survivors: nothing is spawned.
    """
    if os.geteuid() != 0:
        return
    for _ in range(100):
        if not _uid_pids(uid):
            return
        subprocess.run(
            [sandbox_python(), "-I", "-S", "-c", "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass"],
            user=uid, group=uid, extra_groups=[], check=False, timeout=30,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(0.01)
    raise RuntimeError(f"processes of sandbox uid {uid} survive; kill them by uid")


def _write_files(work: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        target = (work / rel).resolve()
        if not str(target).startswith(str(work.resolve()) + os.sep):
            raise ValueError(f"file path {rel!r} escapes the sandbox dir")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)


def _chown_tree(root: Path, uid: int) -> None:
    for dirpath, _dirs, names in os.walk(root):
        os.chown(dirpath, uid, uid)
        for n in names:
            os.chown(os.path.join(dirpath, n), uid, uid)


def run(
    files: dict[str, str | bytes],
    argv: list[str],
    limits: Limits | None = None,
    read_back: list[str] | None = None,
    cwd_on_path: bool = True,
) -> SandboxResult:
    """Write `files` into a fresh dir and run `python argv[0] argv[1:]` there, confined.

    `read_back` names files to return (as text) after the run, e.g. a JSON report the program wrote.
    """
    limits = limits or Limits()
    if not argv or argv[0] not in files:
        raise ValueError(f"argv[0] must be one of the files given, got {argv[:1]!r}")
    root = Path(tempfile.mkdtemp(prefix="rtrl-sbx-"))
    root.chmod(0o711)  # traversable, not listable nor writable: the program's cwd path resolves, nothing else
    work = root / "work"
    work.mkdir()
    uid = _fresh_uid()
    is_root = os.geteuid() == 0
    t0 = time.monotonic()
    try:
        _write_files(work, files)
        if is_root:
            _chown_tree(work, uid)
        conf = {
            "uid": uid, "argv": argv, "report": str(root / "isolation.json"),
            "cpu_s": int(limits.timeout_s) + 1, "memory_mb": limits.memory_mb, "fsize_mb": limits.fsize_mb,
            "nproc": limits.nproc, "nofile": limits.nofile, "tmp_mb": limits.tmp_mb,
            "force_fallback": limits.force_fallback, "cwd_on_path": cwd_on_path,
            "env": {"PATH": "/usr/bin:/bin", "HOME": "/tmp/sandbox", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
                    "PYTHONDONTWRITEBYTECODE": "1"},
        }
        fd = os.open(root / "jail.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # root only: argv may hold a nonce
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(conf))
        out_path, err_path = root / "stdout", root / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sandbox_python(), "-I", "-S", str(JAIL), str(root / "jail.json")],
                cwd=work, env=conf["env"], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
            )
            status, rc = "failed", None
            try:
                rc = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                status = "timeout"
                _kill_group(proc.pid)
                rc = proc.wait()
        duration = time.monotonic() - t0
        _kill_uid(uid) if is_root else _kill_group(proc.pid)
        if status != "timeout":
            if rc == 0:
                status = "passed"
            elif rc == SETUP_FAILED:
                status = "error"
            elif rc < 0:
                status = "killed"  # a signal: SIGKILL/SIGXCPU from a limit, or the program's own doing
            else:
                status = "failed"
        isolation = []
        if (root / "isolation.json").is_file():
            isolation = json.loads((root / "isolation.json").read_text() or "{}").get("isolation", [])
        back = {}
        for rel in read_back or []:
            p = work / rel
            if p.is_file() and not p.is_symlink():
                back[rel] = p.read_text(errors="replace")[: 1 << 20]
        return SandboxResult(status, rc, round(duration, 3), _tail(out_path), _tail(err_path), isolation, back,
                             uid if is_root else None)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


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
