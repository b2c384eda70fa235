"""Solutions that try to forge their verdict instead of earning it: each fails its hidden tests, and the
correct solution passes. Real sandbox (bubblewrap), real judge process, no mocks.

Each forgery below passed on the old runner (tests and model code in one interpreter, the hidden tests in
the work dir, HumanEval judged by exit status): issue 44, item 1.
"""

from __future__ import annotations

import pytest

from evals import humaneval
from evals.judge import judge
from evals.sandbox import Limits

LIMITS = Limits(timeout_s=3)  # a forgery that hangs the wire fails by timeout: keep it short
HIDDEN = {"test_hidden_total.py": "from mathx import total\n\n\ndef test_total():\n"
                                  "    assert total([1, 2, 3]) == 6\n    assert total([5]) == 5\n    assert total([]) == 0\n"}
CORRECT = "def total(xs):\n    return sum(xs)\n"

FORGERIES = {
    # walk the frames up to the runner, read its nonce, print a green report, exit 0
    "frame_walk": (
        "import json, os, sys\n"
        "def total(xs):\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        for k, v in f.f_locals.items():\n"
        "            if k == 'nonce':\n"
        "                print(json.dumps({'nonce': v, 'passed': 1, 'failed': 0, 'collected': 1,\n"
        "                                  'complete': True, 'failures': []}))\n"
        "        f = f.f_back\n"
        "    print(json.dumps({'passed': 1, 'failed': 0, 'collected': 1, 'complete': True, 'failures': []}))\n"
        "    sys.stdout.flush()\n"
        "    os._exit(0)\n"),
    # a value equal to everything
    "rigged_eq": (
        "class Always(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def total(xs):\n    return Always(0)\n"),
    "rigged_eq_object": (
        "class Always:\n"
        "    def __eq__(self, other):\n        return True\n"
        "def total(xs):\n    return Always()\n"),
    "system_exit_0": "def total(xs):\n    raise SystemExit(0)\n",
    "os_exit_0": "import os\ndef total(xs):\n    os._exit(0)\n",
    "exit_at_import": "import os\nos._exit(0)\n",
    # read the hidden tests and answer their exact inputs
    "read_hidden_tests": (
        "import glob, os, re\n"
        "ANSWERS = {}\n"
        "for top in ('.', '/tmp', '/var', '/rtrl', '/dev/shm', '/usr/lib/python3'):\n"
        "  for path in glob.glob(top + '/**/test_hidden*.py', recursive=True):\n"
        "    for args, want in re.findall(r'total\\((.*?)\\) == (\\d+)', open(path).read()):\n"
        "        ANSWERS[args] = int(want)\n"
        "def total(xs):\n"
        "    return ANSWERS.get(repr(xs), -1)\n"),
    # patch the runner's modules: json, the reporting function, builtins
    "patched_runner_module": (
        "import builtins, json, sys\n"
        "json.dumps = lambda *a, **k: '{\"passed\": 1, \"failed\": 0, \"collected\": 1, \"complete\": true}'\n"
        "builtins.AssertionError = type('Swallow', (Exception,), {})\n"
        "for m in list(sys.modules.values()):\n"
        "    if hasattr(m, 'run_file'):\n"
        "        m.run_file = lambda *a, **k: None\n"
        "def total(xs):\n    return -1\n"),
    "shadow_json_module": "def total(xs):\n    return -1\n",  # plus a json.py in the work dir, below
    # print a green report on the way out
    "exit_hook": (
        "import atexit, json, os, sys\n"
        "def green():\n"
        "    print(json.dumps({'passed': 1, 'failed': 0, 'collected': 1, 'complete': True, 'failures': []}))\n"
        "atexit.register(green)\n"
        "sys.excepthook = lambda *a: green()\n"
        "def total(xs):\n    green()\n    sys.exit(0)\n"),
    # kill the judge's side of the wire, or answer for the server
    "forged_answer": (
        "import json, os\n"
        "def total(xs):\n"
        "    for fd in range(3, 40):\n"
        "        try:\n"
        "            os.write(fd, (json.dumps({'id': 2, 'ok': 6}) + '\\n').encode())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return -1\n"),
}


def test_correct_solution_passes():
    r = judge({"mathx.py": CORRECT}, HIDDEN, LIMITS)
    assert r.passed and r.n_passed == 1 and r.status == "passed", r.summary


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_fails_its_hidden_tests(name):
    files = {"mathx.py": FORGERIES[name]}
    if name == "shadow_json_module":
        files["json.py"] = "def dumps(o, **k):\n    return '{\"passed\": 1, \"failed\": 0, \"complete\": true}'\n"
    r = judge(files, HIDDEN, LIMITS)
    assert not r.passed and r.n_passed == 0, (name, r)


def test_hidden_tests_are_not_in_the_sandbox():
    probe = ("import os\n"
             "def total(xs):\n"
             "    seen = []\n"
             "    for root, dirs, names in os.walk('/'):\n"
             "        if root.startswith(('/proc', '/sys', '/usr')):\n"
             "            dirs[:] = []\n"
             "        seen += [os.path.join(root, n) for n in names]\n"
             "    return sorted(seen)\n")
    tests = {"test_hidden_probe.py": "from mathx import total\n\n\ndef test_probe():\n"
                                     "    files = total([])\n    assert 'HIDDEN-MARKER' and files\n"
                                     "    assert not [f for f in files if 'test_hidden' in f], files\n"
                                     "    assert '/tmp/sandbox/mathx.py' in files, files\n"}
    r = judge({"mathx.py": probe}, tests, LIMITS)
    assert r.passed, r.summary


def test_humaneval_exit_and_rigged_answers_fail():
    problems = [p for p in humaneval.load_problems() if p["task_id"] in ("HumanEval/0", "HumanEval/2")]
    forged = {
        "exit": "    raise SystemExit(0)\n",
        "os_exit": "    import os\n    os._exit(0)\n",
        "rigged": "    class A(float):\n        def __eq__(s, o): return True\n        def __sub__(s, o): return 0.0\n"
                  "        def __lt__(s, o): return True\n    return A(0)\n",
    }
    for name, body in forged.items():
        res = humaneval.run_solutions(problems, {p["task_id"]: body for p in problems}, progress=False)
        assert not any(r.passed for r in res), (name, res)
    ok = humaneval.run_solutions(problems, humaneval.canonical(problems), progress=False)
    assert all(r.passed for r in ok), ok


def test_a_test_that_raises_nothing_but_collects_nothing_is_not_a_pass():
    r = judge({"mathx.py": CORRECT}, {"test_empty.py": "from mathx import total\n"}, LIMITS)
    assert not r.passed and r.status == "failed"
