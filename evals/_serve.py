"""The code under test's side of a judged run: answer the judge's questions in plain data, nothing more.

Runs inside the sandbox as the throw-away uid (evals/_jail.py starts it), stdlib only. It reads one
request a line from REQ_FD and writes one answer a line to RESP_FD (the program's own stdout and stderr
stay free for its prints). A request imports a module of the work dir, reads or sets an attribute, calls,
asks len/iter/str..., evaluates the judge's own source (a mutant), or asks a signature. Values come back
through evals/_wire.py: plain data, or a reference the judge may ask further about. No verdict is made
here: the model's code may patch this file's functions or write to RESP_FD itself, and all it can ever
send is a value its own code could have returned.
"""

import builtins
import importlib
import inspect
import logging
import os
import sys

import _wire

SPECIALS = {"len": len, "iter": lambda o: list(o), "bool": bool, "str": str, "repr": repr,
            "getitem": lambda o, k: o[k], "contains": lambda o, k: k in o}


def _builtin_base(exc):
    """The nearest builtin class of an exception (a custom ValueError subclass crosses as ValueError)."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls and issubclass(cls, Exception):
            return cls.__name__
    return "Exception"


class Server:
    def __init__(self):
        self.objects = {}  # reference id -> object
        self.imported = set()

    def ref(self, obj):
        rid = len(self.objects) + 1
        self.objects[rid] = obj
        return {"$ref": rid, "type": str(getattr(type(obj), "__name__", "?"))[:100], "callable": callable(obj)}

    def value(self, tree):
        return _wire.decode(tree, lambda r: self.objects[r["$ref"]])

    def handle(self, msg):
        op = msg.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            raise _wire.WireError(f"unknown op {op!r}")
        return fn(msg)

    def op_import(self, msg):
        name = str(msg["name"])
        if msg.get("fresh"):
            sys.modules.pop(name, None)
        return importlib.import_module(name)

    def op_getattr(self, msg):
        return getattr(self.objects[msg["ref"]], str(msg["name"]))

    def op_setattr(self, msg):
        setattr(self.objects[msg["ref"]], str(msg["name"]), self.value(msg["value"]))

    def op_dir(self, msg):
        return sorted(str(n) for n in dir(self.objects[msg["ref"]]))

    def op_call(self, msg):
        target = self.objects[msg["ref"]]
        args, kwargs = self.value(msg.get("args", [])), self.value(msg.get("kwargs", {"$d": []}))
        if not msg.get("logs"):
            return target(*args, **kwargs)
        records = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = lambda record: records.append(record.getMessage())
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
        try:
            value = target(*args, **kwargs)
        finally:
            root.removeHandler(handler)
            root.setLevel(old_level)
        return (value, [str(r) for r in records])

    def op_special(self, msg):
        fn = SPECIALS[str(msg["name"])]
        return fn(self.objects[msg["ref"]], *self.value(msg.get("args", [])))

    def op_eval(self, msg):
        return eval(str(msg["src"]), {"__builtins__": builtins})  # the judge's own source (a mutant), run here

    def op_signature(self, msg):
        sig = inspect.signature(self.objects[msg["ref"]])
        return [[p.name, p.kind.name, p.default is not p.empty, None if p.default is p.empty else p.default]
                for p in sig.parameters.values()]


def answer(server, msg):
    try:
        result = server.handle(msg)
    except Exception as exc:
        return {"id": msg.get("id"), "exc": {"base": _builtin_base(exc), "name": type(exc).__name__[:100],
                                             "msg": str(exc)[:2000]}}
    except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the judge fails the test, whatever it catches
        return {"id": msg.get("id"), "abort": type(exc).__name__[:100]}
    return {"id": msg.get("id"), "ok": _wire.encode(result, server.ref)}  # cannot cross: main sends an abort


def main(req_fd, resp_fd):
    requests, answers = os.fdopen(req_fd, "rb"), os.fdopen(resp_fd, "wb")
    sys.path.insert(0, os.getcwd())
    server = Server()
    while True:
        msg = _wire.read_message(requests)
        if msg is None:
            return
        try:
            data = _wire.dumps(answer(server, msg))
        except Exception as exc:  # a value that cannot cross (or an answer whose str() raised): the test fails
            data = _wire.dumps({"id": msg.get("id"), "abort": f"unsendable value: {exc}"[:500]})
        answers.write(data)
        answers.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
