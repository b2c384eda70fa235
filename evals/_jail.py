"""The sandbox's first process inside bubblewrap's namespaces: lay out the work dir, drop everything, run.

Started by evals.sandbox as `python -I -S /rtrl/_jail.py CONF_FD` (stdlib only). bubblewrap has already
made the namespaces, the read-only interpreter and the tmpfs; this writes the program's files into
/tmp/sandbox, sets the rlimits, drops to the throw-away uid (as root) and checks that no_new_privs and
no capability are left. Only then does the untrusted code run: a program (`mode` run) or the plain-data
server that the judge calls (`mode` serve, evals/_serve.py). Any failure before that exits 121, and the
program never runs unconfined.
"""

import json
import os
import resource
import sys

SETUP_FAILED = 121


def _write_files(workdir, files, binary, uid):
    os.mkdir(workdir, 0o700)
    for rel, text in files.items():
        if rel.startswith("/") or ".." in rel.split("/") or not rel:
            raise ValueError(f"file path {rel!r} escapes the work dir")
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(text.encode("latin-1") if rel in binary else text.encode("utf-8", "surrogatepass"))
    if uid is not None:
        for dirpath, _dirs, names in os.walk(workdir):
            os.chown(dirpath, uid, uid)
            for n in names:
                os.chown(os.path.join(dirpath, n), uid, uid)


def _limits(c):
    mb = 1024 * 1024
    for name, soft in (("RLIMIT_CPU", c["cpu_s"]), ("RLIMIT_AS", c["memory_mb"] * mb),
                       ("RLIMIT_FSIZE", c["fsize_mb"] * mb), ("RLIMIT_NPROC", c["nproc"]),
                       ("RLIMIT_NOFILE", c["nofile"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (soft, soft))


def _drop(uid):
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise RuntimeError("uid switch did not take")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    if status.get("NoNewPrivs", "").strip() != "1" or int(status.get("CapEff", "1").strip(), 16) != 0:
        raise RuntimeError("no_new_privs unset or capabilities left")


def main():
    with os.fdopen(int(sys.argv[1]), "rb") as f:
        c = json.loads(f.read())
    try:
        _write_files(c["workdir"], c["files"], set(c.get("binary", [])), c["uid"])
        os.chdir(c["workdir"])
        _limits(c)
        _drop(c["uid"])
    except Exception as exc:  # confinement failed: never run the program
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    os.environ.clear()
    os.environ.update(c["env"])
    import runpy

    if c["mode"] == "serve":
        sys.argv = ["/rtrl/_serve.py", str(c["req_fd"]), str(c["resp_fd"])]
        sys.path.insert(0, "/rtrl")
        runpy.run_path("/rtrl/_serve.py", run_name="__main__")
        return
    sys.argv = list(c["argv"])
    if c.get("cwd_on_path", True):  # like `python prog.py`; off for the visible-test runner
        sys.path.insert(0, os.getcwd())
    runpy.run_path(c["argv"][0], run_name="__main__")


if __name__ == "__main__":
    main()
