"""The judge: hidden tests, their assertions and the report, in a process the code under test cannot reach.

Started by evals/judge.py as `python -I -S _judge.py REQ_FD RESP_FD` with its cwd a copy of the final work
dir (files as data, for tests that read them) and the hidden tests on stdin. The model's code runs in the
sandbox behind evals/_serve.py; here every module of the work dir is a proxy (RemoteModule) whose
attributes, calls and answers cross as plain data (evals/_wire.py). So a rigged `__eq__` compares by
identity here and fails, a frame walk finds no judge, an exit or a crash of the code under test is a
RemoteAbort that no test can catch, and the report (stdout, JSON) is written only by this process.
A test passes on positive evidence only: its function ran to its end.
"""

import builtins
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _wire  # noqa: E402


class RemoteAbort(BaseException):
    """The code under test exited, crashed, timed out or broke the protocol: the test fails, whatever it catches."""


class RemoteError(Exception):
    """An exception of the code under test whose nearest builtin class is Exception itself."""


class Link:
    """The judge's end of the wire: one request, then its answer (other ids are skipped)."""

    def __init__(self, req_fd, resp_fd):
        self.out, self.inp, self.n, self.dead = os.fdopen(req_fd, "wb"), os.fdopen(resp_fd, "rb"), 0, ""

    def ask(self, op, **kw):
        if self.dead:
            raise RemoteAbort(self.dead)
        self.n += 1
        try:
            self.out.write(_wire.dumps({"id": self.n, "op": op, **kw}))
            self.out.flush()
            while True:
                resp = _wire.read_message(self.inp)
                if resp is None:
                    return self._die("the code under test exited")
                if resp.get("id") == self.n:
                    break
        except (OSError, _wire.WireError) as exc:
            return self._die(f"broken wire: {exc}")
        if "abort" in resp:
            return self._die(f"the code under test raised {str(resp['abort'])[:200]}")
        if "exc" in resp:
            raise _rebuild(resp["exc"])
        if "ok" not in resp:
            return self._die("malformed answer")
        try:
            return _wire.decode(resp["ok"], self.proxy)
        except (_wire.WireError, TypeError, ValueError) as exc:
            return self._die(f"malformed value: {exc}")

    def _die(self, why):
        self.dead = why
        raise RemoteAbort(why)

    def proxy(self, r):
        return (RemoteCallable if r.get("callable") is True else Remote)(self, r["$ref"], str(r.get("type", "?")))

    def send(self, value):
        return _wire.encode(value, _ref_of)


def _ref_of(value):
    if isinstance(value, (Remote, RemoteModule)):
        return {"$ref": value._rtrl_ref}
    raise TypeError(f"a judge-side {type(value).__name__} cannot cross to the code under test; "
                    "build it there with rtrl_judge.remote(source)")


def _rebuild(exc):
    base = getattr(builtins, str(exc.get("base")), None)
    msg = f"{exc.get('name')}: {exc.get('msg')}"
    if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
        try:
            return base(msg)
        except Exception:
            pass
    return RemoteError(msg)


class Remote:
    """An object of the code under test: ask about it, never run its code here. == is identity."""

    __slots__ = ("_rtrl_link", "_rtrl_ref", "_rtrl_type")
    FORWARDED_DUNDERS = ("__doc__", "__name__", "__qualname__", "__annotations__")

    def __init__(self, link, ref, typ):
        object.__setattr__(self, "_rtrl_link", link)
        object.__setattr__(self, "_rtrl_ref", ref)
        object.__setattr__(self, "_rtrl_type", typ)

    def __getattribute__(self, name):
        if name in Remote.FORWARDED_DUNDERS:
            return object.__getattribute__(self, "_ask")("getattr", name=name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def _ask(self, op, **kw):
        link = object.__getattribute__(self, "_rtrl_link")
        return link.ask(op, ref=object.__getattribute__(self, "_rtrl_ref"), **kw)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=self._rtrl_link.send(value))

    def __dir__(self):
        return self._ask("dir")

    def _special(self, name, *args):
        return self._ask("special", name=name, args=self._rtrl_link.send(list(args)))

    def __len__(self):
        return self._special("len")

    def __iter__(self):
        return iter(self._special("iter"))

    def __getitem__(self, key):
        return self._special("getitem", key)

    def __contains__(self, key):
        return self._special("contains", key)

    def __bool__(self):
        return self._special("bool") is True

    def __str__(self):
        return str(self._special("str"))

    def __repr__(self):
        return f"<remote {self._rtrl_type}: {str(self._special('repr'))[:200]}>"

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__


class RemoteCallable(Remote):
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return self._ask("call", args=self._rtrl_link.send(list(args)), kwargs=self._rtrl_link.send(kwargs))

    @property
    def __signature__(self):
        kinds = inspect.Parameter
        params = [kinds(str(n), getattr(kinds, str(k)), default=d if has else kinds.empty)
                  for n, k, has, d in self._ask("signature")]
        return inspect.Signature(params)


class RemoteModule(types.ModuleType):
    """A module of the work dir: attribute reads and writes go to the sandbox's module of that name."""

    LOCAL = ("__spec__", "__loader__", "__name__", "__package__", "__path__", "__file__", "__cached__",
             "__builtins__", "__doc__", "_rtrl_ref", "_rtrl_link")

    def __getattr__(self, name):
        link, ref = self.__dict__["_rtrl_link"], self.__dict__["_rtrl_ref"]
        if name == "__all__":  # `from m import *`: its __all__, else its public names
            try:
                return link.ask("getattr", ref=ref, name=name)
            except AttributeError:
                return [n for n in link.ask("dir", ref=ref) if not n.startswith("_")]
        if name.startswith("__"):
            raise AttributeError(name)
        return link.ask("getattr", ref=ref, name=name)

    def __setattr__(self, name, value):
        if name in RemoteModule.LOCAL:
            self.__dict__[name] = value
            return
        link = self.__dict__["_rtrl_link"]
        link.ask("setattr", ref=self.__dict__["_rtrl_ref"], name=name, value=link.send(value))

    def __dir__(self):
        return self.__dict__["_rtrl_link"].ask("dir", ref=self.__dict__["_rtrl_ref"])


class WorkDirFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Claims the work dir's module names: importing one imports it in the sandbox and gives a proxy here."""

    def __init__(self, link, names):
        self.link, self.names, self.seen = link, set(names) - set(sys.stdlib_module_names), set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        fresh = spec.name in self.seen  # imported again after a test dropped it: import it afresh there too
        self.seen.add(spec.name)
        mod = RemoteModule(spec.name)
        mod.__dict__["_rtrl_link"] = self.link
        ref = self.link.ask("import", name=spec.name, fresh=fresh)
        mod.__dict__["_rtrl_ref"] = ref._rtrl_ref
        mod.__dict__["__path__"] = []
        return mod

    def exec_module(self, module):
        pass


def helpers(link):
    """`import rtrl_judge` in a hidden test: what a test may do in the sandbox beyond calling."""
    mod = types.ModuleType("rtrl_judge")
    mod.remote = lambda src: link.ask("eval", src=str(src))  # build a value there from the judge's own source
    mod.logs_of = lambda fn, *a, **k: fn._ask("call", args=link.send(list(a)), kwargs=link.send(k), logs=True)
    mod.RemoteAbort, mod.RemoteError = RemoteAbort, RemoteError
    return mod


def run_file(path, source, results):
    name = os.path.splitext(os.path.basename(path))[0]
    mod = types.ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    try:
        exec(compile(source, path, "exec"), mod.__dict__)
    except BaseException as exc:  # a test file that does not import fails as a whole
        results.append({"test": path, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return
    for attr in sorted(vars(mod)):
        fn = mod.__dict__[attr]
        if attr.startswith("test_") and isinstance(fn, types.FunctionType) and fn.__module__ == name:
            try:
                fn()
                results.append({"test": f"{path}::{attr}", "ok": True})
            except BaseException as exc:
                tb = traceback.format_exc(limit=-2)[-800:]
                results.append({"test": f"{path}::{attr}", "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500],
                                "tb": tb})


def main():
    conf = json.loads(sys.stdin.read())
    link = Link(int(sys.argv[1]), int(sys.argv[2]))
    sys.meta_path.insert(0, WorkDirFinder(link, conf["modules"]))
    sys.modules["rtrl_judge"] = helpers(link)
    results = []
    for path, source in sorted(conf["tests"].items()):
        run_file(path, source, results)
    passed = sum(r["ok"] for r in results)
    print(json.dumps({"collected": len(results), "passed": passed, "failed": len(results) - passed,
                      "failures": [r for r in results if not r["ok"]][:10], "complete": True}))


if __name__ == "__main__":
    main()
