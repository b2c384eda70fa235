"""The wire between the judge and the code under test: plain data only, one JSON line a message.

Stdlib only; imported by evals/_serve.py inside the sandbox and by evals/_judge.py outside it. A value
crosses as itself only when its type is exactly one of the plain types (a subclass of int with a rigged
`__eq__` is not an int here); anything else crosses as a reference, {"$ref": id, ...}, that the judge can
only ask questions about. Decoding never runs code: JSON, then a walk that rebuilds tuples, sets, bytes
and complex numbers from their tags and refuses any other object.
"""

import base64
import json

MAX_MESSAGE = 8 * 1024 * 1024  # bytes of one message; a longer line is a protocol error
MAX_DEPTH = 100
PLAIN = (type(None), bool, int, float, str)
TAGS = ("$t", "$s", "$fs", "$b", "$c", "$d", "$ref")


class WireError(Exception):
    """A message that is not plain data of this protocol."""


def encode(value, ref, depth=0):
    """value -> JSON-able tree; `ref(obj)` registers a non-plain object and returns its reference dict."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deep")
    t = type(value)
    if t in PLAIN:
        return value
    if t is list:
        return [encode(v, ref, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [encode(v, ref, depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"$s" if t is set else "$fs": [encode(v, ref, depth + 1) for v in value]}
    if t is bytes:
        return {"$b": base64.b64encode(value).decode()}
    if t is complex:
        return {"$c": [value.real, value.imag]}
    if t is dict:
        return {"$d": [[encode(k, ref, depth + 1), encode(v, ref, depth + 1)] for k, v in value.items()]}
    return ref(value)


def decode(tree, make_ref, depth=0):
    """The inverse of encode, on the judge's side: `make_ref(dict)` builds the proxy for a reference."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deep")
    t = type(tree)
    if t in PLAIN:
        return tree
    if t is list:
        return [decode(v, make_ref, depth + 1) for v in tree]
    if t is not dict:
        raise WireError(f"unexpected {t.__name__} on the wire")
    tag = next((k for k in TAGS if k in tree), None)
    if tag is None:
        raise WireError(f"object without a known tag: {sorted(tree)[:5]}")
    if tag == "$ref":
        if set(tree) - {"$ref", "type", "callable"} or type(tree["$ref"]) is not int:
            raise WireError("malformed reference")
        return make_ref(tree)
    if len(tree) != 1:
        raise WireError(f"tag {tag} with other keys")
    body = tree[tag]
    if tag == "$b":
        return base64.b64decode(str(body), validate=True)
    if type(body) is not list:
        raise WireError(f"tag {tag} needs a list")
    items = [decode(v, make_ref, depth + 1) for v in body]
    if tag == "$t":
        return tuple(items)
    if tag in ("$s", "$fs"):
        return (set if tag == "$s" else frozenset)(items)
    if tag == "$c":
        if len(items) != 2 or not all(type(x) in (int, float) for x in items):
            raise WireError("malformed complex")
        return complex(*items)
    if not all(type(kv) is list and len(kv) == 2 for kv in items):
        raise WireError("malformed dict")
    return {k: v for k, v in items}


def dumps(message) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_MESSAGE:
        raise WireError(f"message of {len(data)} bytes, at most {MAX_MESSAGE}")
    return data


def read_message(f):
    """One message from a binary file; None at end of file."""
    line = f.readline(MAX_MESSAGE + 1)
    if not line:
        return None
    if len(line) > MAX_MESSAGE or not line.endswith(b"\n"):
        raise WireError("message too long or cut off")
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if type(msg) is not dict:
        raise WireError("a message is a JSON object")
    return msg
