"""The sandbox against hostile programs: one hostile property per test, each contained and reported as a
failure while the harness (this pytest process) is unharmed. Real processes, real namespaces, real rlimits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from evals.sandbox import Limits, run

REPO = Path(__file__).resolve().parent.parent


def _run(code: str, **limits) -> object:
    return run({"main.py": code}, ["main.py"], Limits(**limits))


def _uid_processes(uid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = dict(ln.split(":", 1) for ln in (d / "status").read_text().splitlines() if ":" in ln)
                if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
                    out.append(int(d.name))  # zombies are dead, only not yet reaped by init
            except (OSError, ValueError):
                pass
    return out


@pytest.fixture(scope="module")
def confined():
    """Hostile tests only run once a benign probe shows the program really runs as a throw-away uid."""
    r = _run("import os\nprint(os.getuid())")
    assert r.status == "passed", r.stderr
    if "uid" not in r.isolation or r.stdout.strip() == "0":
        pytest.skip(f"not started as root: no throw-away uid (isolation={r.isolation})")
    return r


def test_benign_program_passes_and_reports_isolation(confined):
    r = _run("import sys\nprint('hello'); print('oops', file=sys.stderr)")
    assert r.status == "passed" and r.returncode == 0
    assert r.stdout == "hello\n" and "oops" in r.stderr
    assert "bwrap:mount+pid+net+ipc+uts" in r.isolation and "uid" in r.isolation


def test_failing_program_is_failed(confined):
    r = _run("assert 1 == 2, 'nope'")
    assert r.status == "failed" and r.returncode == 1 and "AssertionError: nope" in r.stderr


def test_infinite_loop_times_out(confined):
    t0 = time.monotonic()
    r = _run("while True:\n    pass", timeout_s=1.0)
    assert r.status == "timeout"
    assert time.monotonic() - t0 < 6
    assert _uid_processes(r.uid) == []


def test_fork_bomb_is_capped_and_reaped(confined):
    code = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    r = _run(code, timeout_s=2.0, nproc=8)
    assert r.status in ("timeout", "killed")
    time.sleep(0.2)
    assert _uid_processes(r.uid) == [], "fork bomb children survived the run"


def test_10gb_allocation_fails(confined):
    r = _run("b = bytearray(10 * 1024 ** 3)\nprint('allocated')", memory_mb=512)
    assert r.status == "failed" and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_writing_outside_the_dir_is_contained(confined, tmp_path):
    token = uuid.uuid4().hex
    targets = [f"/tmp/rtrl-escape-{token}", str(REPO / f"escape-{token}"), str(tmp_path / "escape"),
               f"../escape-{token}", f"/var/tmp/rtrl-escape-{token}"]
    code = (
        "import sys\nescaped = []\n"
        f"for p in {targets!r}:\n"
        "    try:\n        open(p, 'w').write('x'); escaped.append(p)\n"
        "    except OSError as e:\n        print('refused', p, e)\n"
        "open('inside.txt', 'w').write('fine')\n"
        "sys.exit(0 if len(escaped) == len(" + repr(targets) + ") else 1)\n"
    )
    r = _run(code)
    assert r.status == "failed", r.stdout
    for p in targets[:3] + [f"/var/tmp/rtrl-escape-{token}"]:
        assert not Path(p).exists(), f"{p} was written on the host"
    assert not list(Path("/tmp").glob(f"rtrl-sbx-*/escape-{token}"))


def test_opening_a_socket_fails(confined):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "print('connected')\n"
    )
    r = _run(code)
    assert r.status == "failed" and "connected" not in r.stdout
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()
    r2 = _run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert r2.status == "failed" and ("unreachable" in r2.stderr.lower() or "Errno" in r2.stderr)


def test_reading_an_env_secret_fails(confined, monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("RTRL_TEST_SECRET", secret)
    code = (
        "import os\n"
        "found = os.environ.get('RTRL_TEST_SECRET', '')\n"
        "try:\n    found += open(f'/proc/{os.getppid()}/environ').read()\n"
        "except OSError as e:\n    print('refused', e)\n"
        "print(found)\nassert 's3cr3t' in found\n"
    )
    r = _run(code)
    assert r.status == "failed"
    assert secret not in r.stdout and secret not in r.stderr


def test_killing_the_parent_fails(confined):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = (
            "import os, signal\n"
            "os.kill(os.getppid(), signal.SIGKILL)\n"
            f"os.kill({bystander.pid}, signal.SIGKILL)\n"
        )
        r = _run(code)
        assert r.status == "failed" and "PermissionError" in r.stderr
        assert bystander.poll() is None, "a process outside the sandbox was killed"
        assert os.getpid() > 0  # still here
    finally:
        bystander.kill()
        bystander.wait()


def test_cli_prints_json(tmp_path):
    prog = tmp_path / "loop.py"
    prog.write_text("while True:\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "evals.sandbox", str(prog), "--timeout", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    res = json.loads(out.stdout)
    assert out.returncode == 1 and res["status"] == "timeout"
    assert set(res) >= {"status", "returncode", "duration_s", "stdout", "stderr"}


def test_bad_limits_name_the_field():
    with pytest.raises(ValueError, match="Limits.timeout_s"):
        Limits(timeout_s=0)
    with pytest.raises(ValueError, match="argv"):
        run({"a.py": ""}, ["b.py"])


def test_model_code_cannot_fake_a_green_test_report(confined):
    """Reward hacking through the visible-test runner: print a passing report and exit 0, or shadow json."""
    from evals.tools import run_tests

    fake = 'import os\nprint(\'{"passed": 5, "failed": 0, "collected": 5, "complete": true}\')\nos._exit(0)\n'
    files = {"m.py": fake, "test_m.py": "import m\n\n\ndef test_x():\n    assert False\n"}
    res = run_tests(files, Limits(timeout_s=10))
    assert not res.passed and res.n_passed == 0
    shadow = {"json.py": "def dumps(o, **k):\n    return '{\"passed\": 1, \"failed\": 0, \"complete\": true}'\n",
              "test_m.py": "def test_x():\n    assert False\n"}
    res = run_tests(shadow, Limits(timeout_s=10))
    assert not res.passed and res.n_failed == 1


def test_nothing_of_the_house_is_visible(confined, tmp_path, monkeypatch):
    """RTRL_HOME's lake, WAL and mlflow.db, even world-readable, and the repository are not in the sandbox."""
    home = tmp_path / "rtrl-home"
    (home / "var" / "lake" / "raw").mkdir(parents=True)
    secret = "org-secret-" + uuid.uuid4().hex
    for name in ("var/lake/raw/feedback.parquet", "var/mlflow.db", "var/wal.seg"):
        (home / name).write_text(secret)
        (home / name).chmod(0o644)
    tmp_path.chmod(0o755)
    code = (
        "import os, sys\nfound = []\n"
        f"for p in {[str(home / 'var/mlflow.db'), str(REPO / 'rtrl.toml'), '/etc/passwd', '/root']!r}:\n"
        "    try:\n        found.append(open(p).read()[:40])\n"
        "    except OSError as e:\n        print('refused', p, type(e).__name__)\n"
        "print(sorted(os.listdir('/')))\nsys.exit(1 if found else 0)\n"
    )
    r = _run(code)
    assert r.status == "passed", r.stdout + r.stderr
    assert secret not in r.stdout and "refused" in r.stdout


def test_other_processes_command_lines_are_hidden(confined):
    key = "sk-" + uuid.uuid4().hex
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--api-key", key])
    try:
        code = (
            "import os\nseen = ''\n"
            "for d in os.listdir('/proc'):\n"
            "    if d.isdigit():\n"
            "        try:\n            seen += open(f'/proc/{d}/cmdline').read()\n"
            "        except OSError:\n            pass\n"
            "print(len([d for d in os.listdir('/proc') if d.isdigit()]), 'processes')\nprint(seen)\n"
        )
        r = _run(code)
        assert r.status == "passed" and key not in r.stdout, r.stdout
    finally:
        bystander.kill()
        bystander.wait()


def test_memory_is_capped_for_the_whole_tree(confined):
    """Three processes of 600 MB each pass a 1 GB per-process limit; the tree's cgroup stops them."""
    if "cgroup" not in confined.isolation:
        pytest.skip("no writable cgroup here: the tree is bounded by nproc x memory_mb only (evals/cgroup.py)")
    code = ("import os, time\nkids = []\nfor _ in range(3):\n    pid = os.fork()\n"
            "    if pid == 0:\n        b = bytearray(600 * 1024 * 1024)\n        time.sleep(1)\n        os._exit(0)\n"
            "    kids.append(pid)\n"
            "ok = all(os.waitpid(k, 0)[1] == 0 for k in kids)\nprint('all held 600 MB' if ok else 'capped')\n"
            "raise SystemExit(0 if ok else 1)\n")
    r = _run(code, memory_mb=1024, timeout_s=10)
    assert r.status != "passed" and "all held" not in r.stdout, r


def test_writable_space_is_one_capped_tmpfs(confined):
    code = ("import os\nwritten = 0\n"
            "for i in range(10):\n"
            "    try:\n        open(f'big{i}', 'wb').write(b'x' * 15 * 1024 * 1024)\n        written += 15\n"
            "    except OSError as e:\n        print('refused', i, e.errno)\n        break\n"
            "for p in ('/run/lock/x', '/usr/x', '/x'):\n"
            "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
            "    except OSError:\n        pass\n"
            "print('written', written)\n")
    r = _run(code, tmp_mb=32, fsize_mb=16)
    assert "refused" in r.stdout and "wrote" not in r.stdout, r.stdout
    assert int(r.stdout.split("written")[-1]) <= 32


def test_no_new_privileges_and_no_capabilities(confined):
    r = _run("s = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
             "print(s['NoNewPrivs'].strip(), int(s['CapEff'], 16))\n")
    assert r.status == "passed" and r.stdout.split() == ["1", "0"], r.stdout


def test_without_bubblewrap_nothing_runs(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    monkeypatch.setenv("RTRL_BWRAP", str(tmp_path / "no-bwrap"))
    r = _run(f"open({str(marker)!r}, 'w').write('x')")
    assert r.status == "error" and "bubblewrap" in r.stderr and not marker.exists()
