"""Does a model follow the orgs' conventions unprompted? Samples its answers to the simulator's requests.

    .venv/bin/python bench/convention_probe.py --model var/models/smollm2-135m --tasks 12
    .venv/bin/python bench/convention_probe.py --gguf qwen.gguf --tasks 12      # any GGUF, dequantised in memory

Why: an org adapter is trained by policy gradient, so it can only make more likely what the policy already
samples (bench/convention_rate.py counts that on a run's served traffic). This asks the same question of a
model that is not serving yet, before anyone spends a cycle on it: each of the first --tasks bank tasks,
asked by a picky user of each org (who says "Follow our conventions." without naming them, as the simulator
does), rendered with the gateway's own prompt code (tools included), sampled --samples times. The code an
answer would apply is judged by the simulator's check (rl_core/simulate/personas.py). `--suite write_test`
asks the eval suite's write-test tasks instead (the bank has none) and also counts the test style, pytest
functions or unittest classes: a convention candidate. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from convention_rate import answer_code, count_code  # noqa: E402


def load(model: str | None, gguf: str | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if gguf:
        p = Path(gguf).resolve()
        tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
        m = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    else:
        tok = AutoTokenizer.from_pretrained(model)
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return tok, m.eval()


def test_style(source: str) -> str | None:
    """"unittest" (a unittest.TestCase class), "pytest" (module-level test_ functions) or None (no tests)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("TestCase") for b in node.bases):
            return "unittest"
    if any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in tree.body):
        return "pytest"
    return None


def requests(suite: str, n_tasks: int) -> list:
    """The tasks asked: the simulator's bank, or the eval suite's write-test tasks (the bank has none)."""
    from evals.tasks import load_tasks
    from rl_core.simulate.bank import SimTask, load_bank

    if suite == "bank":
        return load_bank()[:n_tasks]
    tasks = load_tasks(Path(__file__).resolve().parent.parent / "evals/tasks", kinds=["write_test"])
    return [SimTask(t, False, "", None) for t in tasks[:n_tasks]]


def probe(tok, model, n_tasks: int, samples: int, temperature: float, max_tokens: int, seed: int,
          suite: str = "bank") -> dict:
    import torch

    from evals.tools import openai_tools
    from rl_core import toolcalls
    from rl_core.serving.app import prompt_ids
    from rl_core.simulate.personas import CONVENTIONS, PERSONAS, Org, User
    from rl_core.simulate.users import request_text

    out = {"answers": 0, "tool_calls": 0, "with_function": 0, "type_hints": 0, "docstrings": 0, "pytest": 0, "unittest": 0,
           "tokens": 0, "seconds": 0.0}
    tasks = requests(suite, n_tasks)
    for org_id in sorted(CONVENTIONS):
        user = User(f"{org_id}-probe", Org(org_id, "", CONVENTIONS[org_id]), PERSONAS["picky"], seed)
        for task in tasks:
            messages = [{"role": "user", "content": request_text(user, task)}]
            ids = torch.tensor([prompt_ids(tok, messages, openai_tools(task.task.tools))])  # [1, P]
            for k in range(samples):
                torch.manual_seed(seed + k)
                t0 = time.perf_counter()
                with torch.no_grad():
                    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                         do_sample=temperature > 0, temperature=temperature or None,
                                         pad_token_id=tok.pad_token_id or tok.eos_token_id)  # [1, P+C]
                out["seconds"] += time.perf_counter() - t0
                out["tokens"] += gen.shape[1] - ids.shape[1]
                # the gateway's parser: a write_file call in the text is what the user would apply
                text, calls = toolcalls.parse(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=False))
                out["answers"] += 1
                out["tool_calls"] += bool(calls)
                code = answer_code(text, calls)
                style = test_style(code) if code else None
                if style:
                    out[style] += 1
                count_code(out, code)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="an HF model folder (a registered checkpoint, var/models/...)")
    src.add_argument("--gguf", help="a GGUF file, dequantised to fp32 in memory")
    ap.add_argument("--suite", choices=("bank", "write_test"), default="bank",
                    help="bank: the simulator's tasks; write_test: the eval suite's write-test tasks")
    ap.add_argument("--tasks", type=int, default=12, help="the first N tasks of the suite")
    ap.add_argument("--samples", type=int, default=1, help="answers per task and org")
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tok, model = load(args.model, args.gguf)
    r = probe(tok, model, args.tasks, args.samples, args.temperature, args.max_tokens, args.seed, args.suite)
    name = args.model or args.gguf
    print(f"{name}: {args.tasks} {args.suite} tasks x 2 orgs x {args.samples} samples, T {args.temperature}, "
          f"{args.max_tokens} tokens; {r['tokens']} tokens in {r['seconds']:.0f} s\n")
    print("| model | suite | answers | with a tool call | define a function | all type-hinted | all with docstrings "
          "| pytest-style tests | unittest classes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {Path(name).name} | {args.suite} | {r['answers']} | {r['tool_calls']} | {r['with_function']} | "
          f"{r['type_hints']} | {r['docstrings']} | {r['pytest']} | {r['unittest']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
