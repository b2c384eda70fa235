"""Verdicts from outside the code under test: `judge(files, hidden_tests, limits) -> TestRun`.

Two processes, two pipes. The work dir's code runs in the sandbox (evals/sandbox.py, mode "serve":
evals/_serve.py answers questions in plain data); the hidden tests run in the judge (evals/_judge.py), a
process of its own outside the sandbox whose cwd is a copy of the final files as data. The hidden tests'
source never enters the sandbox, their assertions run on plain values, and the report comes from the
judge's stdout, which the code under test cannot reach. A run passes only on positive evidence: the
judge completed, collected at least one test, and every collected test ran to its end.

HumanEval goes through the same door (`humaneval_tests`): the problem's prompt and `check` run in the
judge (they are the data set's code), the completion in the sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evals import sandbox

JUDGE = Path(__file__).with_name("_judge.py")
GRACE_S = 2.0  # the judge's own start and report, beyond the sandbox's timeout


@dataclass
class TestRun:
    passed: bool
    n_passed: int
    n_failed: int
    status: str  # passed | failed | timeout | killed | error: the judged run as a whole
    summary: str  # short text for the model / the report


def workspace_modules(files: dict[str, str]) -> list[str]:
    """Top-level module names of a work dir: name.py, and name/ holding Python files (a package)."""
    names = set()
    for rel in files:
        parts = Path(rel).parts
        if len(parts) == 1 and rel.endswith(".py"):
            names.add(rel[:-3])
        elif len(parts) >= 2 and rel.endswith(".py"):
            names.add(parts[0])
    return sorted(n for n in names if n.isidentifier())


def _write_snapshot(root: Path, files: dict[str, str]) -> None:
    sandbox.check_paths(files)  # the one rule for work-dir paths, as the sandbox applies it
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _run_judge(files: dict[str, str], tests: dict[str, str], conf_fds: tuple[int, int], timeout: float):
    """Start the judge on a copy of the files; returns (report or None, stderr, timed_out)."""
    req_w, resp_r = conf_fds
    conf = json.dumps({"tests": tests, "modules": workspace_modules(files)})
    with tempfile.TemporaryDirectory(prefix="rtrl-judge-") as snap:
        _write_snapshot(Path(snap), files)
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(JUDGE), str(req_w), str(resp_r)], cwd=snap,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=conf_fds, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        _close(req_w, resp_r)
        try:
            out, err = proc.communicate(conf.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return None, err.decode(errors="replace")[-2000:], True
    report = None
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("complete") is True:
            report = obj
            break
    return (report if proc.returncode == 0 else None), err.decode(errors="replace")[-2000:], False


def judge(files: dict[str, str], tests: dict[str, str], limits: sandbox.Limits) -> TestRun:
    """Run `tests` (path -> source, trusted) against `files` (the work dir, untrusted) and judge them."""
    if not tests:
        raise ValueError("judge needs at least one hidden test file")
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    try:
        box = sandbox.Confined(files, [], limits, mode="serve", pass_fds=(req_r, resp_w),
                               extra={"req_fd": req_r, "resp_fd": resp_w})
    except sandbox.SandboxUnavailable as exc:
        _close(req_r, req_w, resp_r, resp_w)
        return TestRun(False, 0, 0, "error", f"sandbox unavailable: {exc}")
    _close(req_r, resp_w)
    try:
        report, err, timed_out = _run_judge(files, tests, (req_w, resp_r), limits.timeout_s + GRACE_S)
    finally:
        box.kill()
    res = box.wait(timeout=1.0)
    return _verdict(report, err, timed_out, res)


def _verdict(report: dict | None, err: str, timed_out: bool, res: sandbox.SandboxResult) -> TestRun:
    if timed_out or report is None:
        status = "timeout" if timed_out else "error"
        why = "the judge timed out" if timed_out else "the judge did not report: " + err[-500:]
        return TestRun(False, 0, 0, status, f"tests {status}: {why}")
    n_pass, n_fail, n = int(report["passed"]), int(report["failed"]), int(report["collected"])
    passed = n > 0 and n_fail == 0 and n_pass == n
    lines = [f"{n_pass} passed, {n_fail} failed"]
    lines += [f"FAILED {f['test']}: {f.get('error', '')}"[:300] for f in report.get("failures", [])[:5]]
    if res.stderr.strip() and not passed:
        lines.append("stderr of the code under test: " + res.stderr.strip()[-300:])
    return TestRun(passed, n_pass, n_fail, "passed" if passed else "failed", "\n".join(lines))


def humaneval_tests(problem: dict) -> dict[str, str]:
    """The judge's test file for a HumanEval problem: its prompt's helpers and `check`, on the remote entry point."""
    entry = problem["entry_point"]
    src = (f"import solution as _solution\n\n{problem['prompt']}\n    pass\n\n\n{entry} = _solution.{entry}  # tests may name it\n\n"
           f"{problem['test']}\n\n\ndef test_check():\n    check(_solution.{entry})\n")
    return {"test_humaneval.py": src}
