"""How often a run's answers already follow each organisation's convention, before any adapter exists.

    python bench/convention_rate.py --run-id cycle-...      (RTRL_HOME picks the lake; episodes.parquet of that run)

Why: an org adapter is trained by policy gradient on the org's episodes. It can only raise the rate of
answers that follow the org's convention (acme: type hints, globex: docstrings) if the policy sometimes
writes them: an answer the policy never samples earns no reward to push towards. This reads a run's
episodes, takes the code each answer wrote (the write_file/apply_patch tool call, else the answer's code
block, as the simulated user applies it), and counts per org the answers that define a function, and of
those the ones whose every function has full type hints, and a docstring. The check is the simulator's
own (rl_core/simulate/personas.py, Org.violations). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def answer_code(text: str | None, tool_calls) -> str | None:
    """The source an answer wrote: its file-writing tool calls' contents, else its first code block."""
    from rl_core.simulate.users import CODE_BLOCK_RE

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


def follows(source: str, convention: str) -> bool | None:
    """None when the source defines no function (or does not parse); else whether every function follows."""
    import ast

    from rl_core.simulate.personas import Org

    try:
        if not any(isinstance(n, ast.FunctionDef) for n in ast.walk(ast.parse(source))):
            return None
    except SyntaxError:
        return None
    return not Org("probe", "", convention).violations(source)


def rates(rows: list[dict]) -> list[dict]:
    out: dict[str, dict] = {}
    for r in rows:
        o = out.setdefault(r["org_id"], {"org": r["org_id"], "answers": 0, "with_function": 0, "type_hints": 0,
                                         "docstrings": 0, "persisted": 0, "reverted": 0})
        o["answers"] += 1
        o["persisted"] += bool(r["edit_persisted"])
        o["reverted"] += bool(r["edit_reverted"])
        count_code(o, answer_code(r["completion_text"], r["tool_calls"]))
    return sorted(out.values(), key=lambda o: o["org"])


def count_code(o: dict, code: str | None) -> None:
    """Add one answer's code to o's with_function / type_hints / docstrings counts (nothing without a function)."""
    hinted = follows(code, "type_hints") if code is not None else None
    if hinted is None:
        return
    o["with_function"] += 1
    o["type_hints"] += hinted
    o["docstrings"] += bool(follows(code, "docstrings"))


def main(argv: list[str] | None = None) -> int:
    from rl_core.config import load_config
    from rl_core.lake import Lake

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-id", required=True, help="a run whose episodes.parquet the harvest wrote")
    args = ap.parse_args(argv)
    lake = Lake(load_config().lake_root)
    path = f"runs/{args.run_id}/episodes.parquet"
    try:
        table = lake.read_parquet(path)
    except FileNotFoundError:
        print(f"convention_rate: no {path} in the lake (--run-id names a harvested run)", file=sys.stderr)
        return 2
    cols = ["org_id", "completion_text", "tool_calls", "edit_persisted", "edit_reverted"]
    got = rates(table.select(cols).to_pylist())
    print(f"run {args.run_id}: {table.num_rows} episodes\n")
    print("| org | answers | define a function | all type-hinted | all with docstrings | persisted | reverted |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for o in got:
        print(f"| {o['org']} | {o['answers']} | {o['with_function']} | {o['type_hints']} | {o['docstrings']} | "
              f"{o['persisted']} | {o['reverted']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
