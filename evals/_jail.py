"""The child side of the sandbox: confine this process, then run the target program in it.

Started by evals.sandbox as `python -I -S _jail.py CONFIG.json` (as root where possible, stdlib only).
Order matters: namespaces and mounts need root, so they come first; then resource limits; then the
switch to a throw-away uid that owns nothing but the working directory; only then the untrusted code.
Every step that the host refuses (no root, no CAP_SYS_ADMIN) falls back to an audit hook that blocks
sockets and writes outside the working directory, and the result says which isolation was in force.
"""

import ctypes
import json
import os
import resource
import sys

SETUP_FAILED = 121  # exit code when confinement could not be set up: the sandbox reports "error"
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4


def _libc():
    return ctypes.CDLL(None, use_errno=True)


MOUNT_POINT = b"/tmp/sandbox"  # where the program sees its working dir once /tmp is a private tmpfs


def _namespaces(tmp_mb):
    """Private network (only a down loopback) and a private tmpfs over each shared scratch dir.

    The working dir lives under the host's /tmp, which the tmpfs hides, so it is bind-mounted back
    (through an fd opened before) at /tmp/sandbox, the program's cwd: paths built from __file__ keep working.
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        return False
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    work_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)  # after unshare: a bind needs a mount of this namespace
    opts = f"size={tmp_mb}m,mode=1777".encode()
    for d in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(d) and libc.mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            return False
    os.mkdir(MOUNT_POINT)
    if libc.mount(f"/proc/self/fd/{work_fd}".encode(), MOUNT_POINT, None, 4096, None) != 0:  # MS_BIND
        return False
    os.close(work_fd)
    os.chdir(MOUNT_POINT)
    return True


def _limits(c):
    mb = 1024 * 1024
    for name, soft in (
        ("RLIMIT_CPU", c["cpu_s"]),
        ("RLIMIT_AS", c["memory_mb"] * mb),
        ("RLIMIT_FSIZE", c["fsize_mb"] * mb),
        ("RLIMIT_NPROC", c["nproc"]),
        ("RLIMIT_NOFILE", c["nofile"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (soft, soft))


def _audit_fallback(workdir):
    """Weaker, in-process confinement for hosts without namespaces: no sockets, no writes outside workdir."""
    root = os.path.realpath(workdir)

    def hook(event, args):
        if event.startswith("socket.") and event not in ("socket.gethostname",):
            raise PermissionError(f"sandbox: network is disabled ({event})")
        if event == "open" and args[1] is not None and any(ch in str(args[1]) for ch in "wax+"):
            path = args[0]
            if isinstance(path, (str, bytes)):
                p = os.path.realpath(os.fsdecode(path))
                if p != root and not p.startswith(root + os.sep):
                    raise PermissionError(f"sandbox: write outside the working dir refused: {p}")

    sys.addaudithook(hook)


def main():
    with open(sys.argv[1]) as f:
        c = json.load(f)
    isolation = []
    report = open(c["report"], "w")  # opened before /tmp is hidden; the program cannot reach it
    try:
        is_root = os.geteuid() == 0
        if is_root and not c.get("force_fallback") and _namespaces(c["tmp_mb"]):
            isolation.append("netns+mountns")
        _limits(c)
        if is_root:
            isolation.append("uid")
        if "netns+mountns" not in isolation:
            isolation.append("audit-hook")
        json.dump({"isolation": isolation, "cwd": os.getcwd()}, report)
        report.close()
        if is_root:
            os.setgroups([])
            os.setgid(c["uid"])
            os.setuid(c["uid"])
            if os.getuid() == 0 or os.geteuid() == 0:
                raise RuntimeError("uid switch did not take")
        if "audit-hook" in isolation:
            _audit_fallback(os.getcwd())
    except Exception as exc:  # confinement failed: never run the program unconfined
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    os.environ.clear()
    os.environ.update(c["env"])
    sys.argv = list(c["argv"])
    if c.get("cwd_on_path", True):  # like `python prog.py`; off for our test runner, which adds it after its imports
        sys.path.insert(0, os.getcwd())
    import runpy

    runpy.run_path(c["argv"][0], run_name="__main__")


if __name__ == "__main__":
    main()
