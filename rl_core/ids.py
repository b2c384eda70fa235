"""One rule for identifiers, applied at every entry (HTTP, CLI, DAG params, the lake's run folders).

An identifier becomes a folder name (runs/<run_id>/), an MLflow tag compared in a search filter, a
Prometheus label and a log line, so it is held to what all four can carry: a pattern that admits no
quote, backslash, slash, control character or white space, and a length. Values that are text rather
than names (user ids, which come from other products) get the weaker TEXT rule: printable, bounded.

`mlflow_filter_value` is the one way a value enters an MLflow search filter string.
"""

from __future__ import annotations

import re

MAX_ID = 128  # run ids: cycle-20261206T1400-20261206T1900.acme is 39; room for org names and suffixes
MAX_TEXT_ID = 256  # user and session ids from the caller's own systems

# a name: starts with a letter or digit, then letters, digits and . _ - (no '..': never a path climb)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ORG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # org ids: no '.', which separates <run_id>.<org_id>
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class IdError(ValueError):
    """An identifier broke the rule; the message names the field and says what is allowed."""


def check_name(field: str, value: object, max_len: int = MAX_ID) -> str:
    """A run id or other plain name: NAME_RE, at most max_len characters, no '..'."""
    if not isinstance(value, str) or not value:
        raise IdError(f"{field}: must be a non-empty string, got {value!r:.80}")
    if len(value) > max_len:
        raise IdError(f"{field}: {len(value)} characters, at most {max_len} allowed")
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise IdError(f"{field}: {value!r:.80} is not a plain name (letters, digits, '.', '_', '-'; "
                      "starts with a letter or digit; no '..')")
    return value


def check_run_id(value: object, field: str = "run_id") -> str:
    return check_name(field, value)


def check_org_id(value: object, field: str = "org_id") -> str:
    """An organisation id: ORG_RE (no '.'), at most 64 characters."""
    check_name(field, value, 64)
    if not ORG_RE.fullmatch(str(value)):
        raise IdError(f"{field}: {value!r:.80} is not an org name (letters, digits, '_', '-')")
    return str(value)


def is_org_id(value: object) -> bool:
    """Does value pass check_org_id? (for filters over stored rows, which must skip rather than raise)"""
    try:
        check_org_id(value)
    except IdError:
        return False
    return True


def check_text_id(field: str, value: object, max_len: int = MAX_TEXT_ID) -> str:
    """A caller's own id (user, session): non-empty, at most max_len characters, no control characters."""
    if not isinstance(value, str) or not value:
        raise IdError(f"{field}: must be a non-empty string")
    if len(value) > max_len:
        raise IdError(f"{field}: {len(value)} characters, at most {max_len} allowed")
    if _CONTROL.search(value):
        raise IdError(f"{field}: contains a control character")
    return value


def mlflow_filter_value(value: object) -> str:
    """`value` as a quoted literal for an MLflow search filter: 'text'.

    MLflow's filter parser (sqlparse) takes a quoted string but does not unescape it, so a value with a
    quote or a backslash can be neither matched nor safely escaped: it is refused. Ids are checked before
    they get here; this is the second wall, so no value can end the literal and add a clause.
    """
    text = str(value)
    if _CONTROL.search(text) or "'" in text or "\\" in text or '"' in text:
        raise IdError(f"filter value {text!r:.80} holds a quote, a backslash or a control character")
    return f"'{text}'"
