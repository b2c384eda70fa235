"""Answer features: deterministic checks on an assistant answer (its text, or the code a user would apply).

Why: a simulated user can only reward what the policy sometimes does. A policy gradient makes likelier what
the policy already samples, so a preference the base model never shows (SmolLM2-135M writes 0 type-hinted
functions in 137 answers) gives the update nothing to push. `bench/feature_census.py` measures how often the
base model shows each feature here; the simulator's preferences (`[simulate] preference`, `conventions`)
name one of them, and users express it only through events the gateway already records (thumbs, a reverted
edit). Every check is a pure function of the answer, so the census, the simulator and the experiment's
per-cycle rates never disagree.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field

from rl_core import toolcalls

CODE_BLOCK_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
FENCE_RE = re.compile(r"```([A-Za-z0-9_+-]*)")
SHORT_WORDS = 40  # "short answer": at most this many whitespace-separated words


@dataclass(frozen=True)
class Answer:
    """One assistant turn as a user sees it: the text, its tool calls, and the code it would apply."""

    text: str
    tool_calls: list[dict] = field(default_factory=list)

    @property
    def code(self) -> str | None:
        return answer_code(self.text, self.tool_calls)


def answer_code(text: str | None, tool_calls: list[dict] | None) -> str | None:
    """The source an answer writes: its write_file/apply_patch calls' contents, else its first code block
    (what the simulated user pastes over the file)."""
    parts = []
    for call in tool_calls or []:
        fn = call.get("function") or {}
        if fn.get("name") in ("write_file", "apply_patch"):
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                continue
            parts.append(str(args.get("content") or args.get("patch") or ""))
    if parts:
        return "\n".join(parts)
    m = CODE_BLOCK_RE.search(text or "")
    return m.group(1) if m else None


def _tree(code: str | None) -> ast.Module | None:
    try:
        return ast.parse(code) if code else None
    except (SyntaxError, ValueError):
        return None


def _functions(code: str | None) -> list[ast.FunctionDef]:
    tree = _tree(code)
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] if tree else []


def _tokens(code: str | None) -> list[tokenize.TokenInfo]:
    if not code:
        return []
    try:
        return list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []


def _strings(code: str | None) -> list[str]:
    """The code's string literals, f-strings included, but not triple-quoted ones (docstrings)."""
    return [t.string for t in _tokens(code) if t.type == tokenize.STRING and not t.string.startswith(('"""', "'''"))]


def _prose(text: str) -> str:
    """The answer's text outside code fences."""
    return re.sub(r"```.*?(```|$)", "", text, flags=re.DOTALL)


def inline_comment(a: Answer) -> bool:
    return any(t.type == tokenize.COMMENT for t in _tokens(a.code))


def fstring(a: Answer) -> bool:
    fstart = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12 tokenizes f-strings apart
    return any(t.type == fstart or (t.type == tokenize.STRING and re.match(r"(?i)^[rbu]*f", t.string))
               for t in _tokens(a.code))


def double_quotes(a: Answer) -> bool:
    s = _strings(a.code)
    return bool(s) and all(x.lstrip("rRbBuUfF").startswith('"') for x in s)


def single_quotes(a: Answer) -> bool:
    s = _strings(a.code)
    return bool(s) and all(x.lstrip("rRbBuUfF").startswith("'") for x in s)


def summary_first(a: Answer) -> bool:
    """A sentence of prose before the first code fence (not an answer that opens with code)."""
    head = a.text.split("```", 1)[0] if "```" in a.text else ""
    return bool(re.search(r"[A-Za-z]{3,}", head))


def prose_after_code(a: Answer) -> bool:
    """Explanation after the last closed code block."""
    parts = a.text.split("```")
    return len(parts) >= 3 and len(parts) % 2 == 1 and bool(re.search(r"[A-Za-z]{3,}", parts[-1]))


def short_answer(a: Answer) -> bool:
    return len(a.text.split()) <= SHORT_WORDS


def python_fence(a: Answer) -> bool:
    """Every code fence opened is labelled python (```python or ```py), none bare."""
    opens = FENCE_RE.findall(a.text)[::2]
    return bool(opens) and all(x in ("python", "py") for x in opens)


def code_block(a: Answer) -> bool:
    return CODE_BLOCK_RE.search(a.text) is not None


def writes_code(a: Answer) -> bool:
    """Any code: a fence opened (closed or cut off at max_tokens) or a file-writing tool call."""
    return "```" in a.text or a.code is not None


def tool_call(a: Answer) -> bool:
    return bool(a.tool_calls)


def early_return(a: Answer) -> bool:
    """A function returns from inside an `if` before its last statement (a guard clause)."""
    for fn in _functions(a.code):
        for stmt in fn.body[:-1]:
            if isinstance(stmt, ast.If) and any(isinstance(s, ast.Return) for s in stmt.body):
                return True
    return False


def main_guard(a: Answer) -> bool:
    return bool(re.search(r"if\s+__name__\s*==\s*['\"]__main__['\"]", a.code or ""))


def test_included(a: Answer) -> bool:
    tree = _tree(a.code)
    return bool(tree) and any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") or isinstance(n, ast.Assert)
                              for n in ast.walk(tree))


def print_call(a: Answer) -> bool:
    tree = _tree(a.code)
    return bool(tree) and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print" for n in ast.walk(tree))


def bullet_list(a: Answer) -> bool:
    return bool(re.search(r"(?m)^\s*(?:[-*]|\d+\.)\s+\S", _prose(a.text)))


def type_hints(a: Answer) -> bool:
    """Every function fully annotated (the old acme convention; the base model almost never samples it)."""
    fns = _functions(a.code)
    return bool(fns) and all(f.returns is not None and all(x.annotation for x in f.args.args) for f in fns)


def docstrings(a: Answer) -> bool:
    """Every function has a docstring (the old globex convention; the base model almost never samples it)."""
    fns = _functions(a.code)
    return bool(fns) and all(ast.get_docstring(f) is not None for f in fns)


@dataclass(frozen=True)
class Feature:
    name: str
    describe: str  # what a user would say when asking for it
    check: Callable[[Answer], bool]
    on_code: bool  # judged on the applied code (so a picky user can revert an edit for it)


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("inline_comment", "comment the code", inline_comment, True),
    Feature("fstring", "use f-strings", fstring, True),
    Feature("double_quotes", "use double quotes for strings", double_quotes, True),
    Feature("single_quotes", "use single quotes for strings", single_quotes, True),
    Feature("summary_first", "say in a sentence what you change before the code", summary_first, False),
    Feature("prose_after_code", "explain the code after it", prose_after_code, False),
    Feature("short_answer", f"keep answers under {SHORT_WORDS} words", short_answer, False),
    Feature("python_fence", "label code blocks as python", python_fence, False),
    Feature("code_block", "answer with a code block", code_block, False),
    Feature("writes_code", "answer with code", writes_code, False),
    Feature("tool_call", "edit through the tools", tool_call, False),
    Feature("early_return", "use guard clauses (early return)", early_return, True),
    Feature("main_guard", "add an `if __name__ == '__main__'` guard", main_guard, True),
    Feature("test_included", "include a test", test_included, True),
    Feature("print_call", "print the result", print_call, True),
    Feature("bullet_list", "use bullet points", bullet_list, False),
    Feature("type_hints", "add type hints", type_hints, True),
    Feature("docstrings", "add docstrings", docstrings, True),
)}


def feature(name: str) -> Feature:
    """The feature called name, or a ValueError that lists the known ones."""
    if name not in FEATURES:
        raise ValueError(f"unknown answer feature {name!r}; known: {', '.join(sorted(FEATURES))}")
    return FEATURES[name]


def features_of(text: str, tool_calls: list[dict] | None = None) -> dict[str, bool]:
    """Every feature of one answer."""
    a = Answer(text or "", list(tool_calls or []))
    return {name: bool(f.check(a)) for name, f in FEATURES.items()}


def episode_features(completion_text: str | None, tool_calls_json: str | None = None) -> dict[str, bool]:
    """Every feature of one logged episode. The lake keeps the engine's raw text (tool-call markup included),
    so it is split as the gateway splits it before the user sees it."""
    text, calls = toolcalls.parse(completion_text or "")
    if not calls and isinstance(tool_calls_json, str) and tool_calls_json:  # null in the lake: NaN in pandas
        calls = json.loads(tool_calls_json) or []
    return features_of(text, calls)


@dataclass(frozen=True)
class Rate:
    """k of n answers, with a 95% Wilson score interval (sane at 0 and n, unlike the normal one)."""

    k: int
    n: int
    rate: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, k: int, n: int, z: float = 1.96) -> Rate:
        if n == 0:
            return cls(k, n, math.nan, math.nan, math.nan)
        p = k / n
        mid = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return cls(k, n, p, max(0.0, mid - half), min(1.0, mid + half))


def feature_rates_of(answers: list[dict[str, bool]]) -> dict[str, Rate]:
    """Every feature's Rate over answers given as features_of() dicts (the census, a cycle's served turns)."""
    return {name: Rate.of(sum(a[name] for a in answers), len(answers)) for name in FEATURES}
