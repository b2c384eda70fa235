"""Where config values come from: the file, its profile tables and RTRL_* environment variables, each value's
origin recorded so that a bad one is reported with the file (or variable), the section and the key.

rl_core/config.py holds the typed sections and `load_config`, which merges these sources and validates them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

REPO_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """A config value is wrong; the message names where it came from and which field."""


def find_config_file() -> Path | None:
    if explicit := os.environ.get("RTRL_CONFIG"):
        if not Path(explicit).is_file():
            raise ConfigError(f"RTRL_CONFIG={explicit}: no such file")
        return Path(explicit)
    return next((c for c in (Path.cwd() / "rtrl.toml", REPO_ROOT / "rtrl.toml") if c.is_file()), None)


def deep_merge(base: dict, over: dict, sources: dict, origin: str, prefix: str = "") -> dict:
    out = dict(base)
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("tokens", "weights"):
            out[key] = deep_merge(out[key], value, sources, origin, dotted + ".")
        else:
            out[key] = value
            sources[dotted] = origin
    return out


def env_overrides(environ: dict[str, str], sources: dict) -> dict:
    over: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith("RTRL_") or "__" not in name:
            continue
        section, _, key = name[len("RTRL_"):].lower().partition("__")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key in STRING_KEYS:
            value = raw  # e.g. RTRL_SERVING__HOST=127 stays a string
        over.setdefault(section, {})[key] = value
        sources[f"{section}.{key}"] = f"env {name}"
    return over


STRING_KEYS = {"host", "root", "home", "tracking_uri", "artifact_root", "hostfile", "wal_dir", "tasks_dir"}


def format_errors(err: ValidationError, sources: dict, file_label: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        # the most specific key that has a recorded origin (the file, the profile or an env variable)
        origin = next((sources[k] for i in range(len(loc), 0, -1) if (k := ".".join(loc[:i])) in sources), None)
        field = f"[{loc[0]}] {'.'.join(loc[1:])}" if len(loc) > 1 else ".".join(loc)
        lines.append(f"{origin or file_label}: {field}: {e['msg']} (got {e.get('input')!r})")
    return "invalid rtrl config:\n  " + "\n  ".join(lines)


def flatten(d: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        if isinstance(v, dict) and k != "profiles":
            keys.extend(flatten(v, f"{prefix}{k}."))
        keys.append(f"{prefix}{k}")
    return keys
