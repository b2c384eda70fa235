"""`rtrl`: one command for every stage of the cycle.

Each subcommand lives with the stage it drives: COMMANDS maps a name to "module:function", where the
function takes an argparse parser, adds its arguments and sets `run` (a callable args -> exit code).
Only the chosen subcommand's module is imported, so `rtrl --help` is instant and a stage that is not
built yet answers "not implemented yet" with a non-zero exit, never a fake success.

Every command passes one entry check here (check_args): its identifiers (--run-id, --org) by rl_core/ids.py's
rule and its window (--start/--end) by [harvest] max_window_hours (rl_core/window.py), each refused with one
line naming the argument, exit code 2. Everything it creates is its user's alone (umask 077, the home 0700:
rl_core.runtime.procs.private_state), because the lake, the WAL and mlflow.db hold every organisation's traffic.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from datetime import datetime
from typing import Any

from rl_core.config import Config, ConfigError, load_config
from rl_core.ids import IdError, check_org_id, check_run_id
from rl_core.window import WindowError, check_window

COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("rl_core.init:add_init", "convert the base model once and register it as version 1 (champion)"),
    "config": ("rl_core.cli:add_config", "show the effective configuration (file + profile + env)"),
    "serve": ("rl_core.serving.cli:add_serve", "serve champion/challenger behind an OpenAI-compatible API"),
    "collect": ("rl_core.collect.cli:add_collect", "compact the write-ahead event log into the Parquet lake"),
    "harvest": ("rl_core.harvest:add_harvest", "one cycle's window of interactions + feedback -> episodes"),
    "rewards": ("rl_core.rewards.cli:add_rewards", "score a run's episodes into rewards; run the hacking monitors"),
    "gate": ("rl_core.quality.cli:add_gate", "run a Great Expectations data-quality gate on a run"),
    "train": ("rl_core.train.launch:add_train", "on-policy DeepSpeed update of a version on a run's episodes"),
    "eval": ("evals.cli:add_eval", "run the eval suite (cursorbench, humaneval) on a version or checkpoint"),
    "register": ("rl_core.registry.cli:add_register", "register a trained checkpoint as a new MLflow version"),
    "deploy": ("rl_core.registry.cli:add_deploy", "promotion gate, then alias `challenger` for a run's version"),
    "ab": ("rl_core.registry.cli:add_ab",
           "A/B verdict (promote / rollback / continue) from logged outcomes; --org: an org's adapter vs its base"),
    "promote": ("rl_core.registry.cli:add_promote", "move `champion` to the challenger"),
    "rollback": ("rl_core.registry.cli:add_rollback", "restore the previous champion / drop the challenger"),
    "registry": ("rl_core.registry.cli:add_registry", "aliases, rtrl's record of its moves, alias drift (--adopt / --revert)"),
    "forget": ("rl_core.forget:add_forget", "delete an organisation's (or user's) rows from the lake"),
}


ENTRY_POINTS = "rtrl.commands"  # other packages' tables of the same form (the lab's: lab/commands.py)


def commands() -> dict[str, tuple[str, str]]:
    """The product's commands, then every installed `rtrl.commands` entry point's (without importing their modules)."""
    from importlib.metadata import entry_points

    found = dict(COMMANDS)
    for ep in entry_points(group=ENTRY_POINTS):
        found.update({k: v for k, v in ep.load().items() if k not in COMMANDS})
    return found


class NotImplementedYet(Exception):
    pass


def _load(spec: str):
    module_name, _, func = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise NotImplementedYet(module_name) from None
        raise
    if not hasattr(module, func):
        raise NotImplementedYet(spec)
    return getattr(module, func)


def build_parser(chosen: str | None = None, table: dict[str, tuple[str, str]] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtrl",
        description="rtrl: improve a coding assistant from its production traffic, one cycle every few hours.",
        epilog="Config: rtrl.toml, RTRL_PROFILE=default|tiny, RTRL_HOME, RTRL_<SECTION>__<KEY>. See README.md.",
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (spec, help_text) in (table if table is not None else commands()).items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            _load(spec)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()  # one scan of the installed entry points per invocation
    chosen = argv[0] if argv and argv[0] in table else None
    try:
        parser = build_parser(chosen, table)
    except NotImplementedYet as exc:
        print(f"rtrl {chosen}: not implemented yet ({exc})", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    run = getattr(args, "run", None)
    if run is None:
        parser.parse_args([args.command, "--help"])
        return 2
    from rl_core.runtime.procs import STATE_UMASK  # lazy: keeps rtrl --help fast (urllib, subprocess)

    previous = os.umask(STATE_UMASK)  # before anything is created; private_state keeps it (and tightens the home)
    try:
        check_args(args)
        return int(run(args) or 0)
    except (ConfigError, IdError, WindowError) as exc:
        print(f"rtrl {args.command}: {exc}", file=sys.stderr)
        return 2
    finally:
        os.umask(previous)  # for callers in-process (tests); a command's own process ends here anyway


# argument (its dest) -> the flag that names it and the rule it must pass
ID_ARGS = {"run_id": ("--run-id", check_run_id), "org": ("--org", check_org_id), "org_id": ("--org-id", check_org_id)}


def check_args(args: argparse.Namespace) -> None:
    """The entry check of every command: identifiers by the one rule, a --start/--end window no longer than
    [harvest] max_window_hours; the home made private. Raises IdError / WindowError / ConfigError."""
    for dest, (flag, check) in ID_ARGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            check(value, flag)
    from rl_core.runtime.procs import private_state

    cfg = load_config()
    private_state(cfg)
    start, end = getattr(args, "start", None), getattr(args, "end", None)
    if isinstance(start, datetime) and isinstance(end, datetime):
        check_window(start, end, cfg.harvest.max_window_hours)


# --- rtrl config ----------------------------------------------------------------------------------

def add_config(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    show = sub.add_parser("show", help="print the effective config as TOML")
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.set_defaults(run=_config_show)


def _config_show(args) -> int:
    cfg = load_config()
    print(cfg.model_dump_json(indent=2) if args.json else to_toml(cfg), end="" if not args.json else "\n")
    return 0


def to_toml(cfg: Config) -> str:
    """The effective config as TOML text (what `rtrl config show` prints)."""
    data = cfg.model_dump(exclude={"source"})
    lines = [f"# effective rtrl config (profile {cfg.profile}, from {cfg.source})"]
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    lines += [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for section, values in data.items():
        if not isinstance(values, dict):
            continue
        lines.append(f"\n[{section}]")
        for k, v in values.items():
            # TOML has no null: an unset optional key is shown as a comment
            lines.append(f"# {k} unset" if v is None else f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        # TOML has no null: an unset optional key inside an inline table is left out
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


if __name__ == "__main__":
    sys.exit(main())
