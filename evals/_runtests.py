"""A minimal test runner copied into the sandbox (stdlib only, starts in milliseconds, unlike pytest).

`python _rtrl_runtests.py NONCE [FILE ...]` imports each test file (default: every test_*.py /
tests/test_*.py), calls every top-level function named test_*, and prints one JSON line
{"nonce", "passed", "failed", "failures"}. Exit 0 only when at least one test ran and none failed.
The nonce (kept in a local, gone from sys.argv; the sandbox's argv file is unreadable to the program)
stops model code from faking a green report by printing one and calling os._exit(0). Our stdlib imports
happen before the repo joins sys.path, so a repo file named json.py cannot replace them.
"""

import glob
import importlib.util
import json
import os
import sys
import traceback


def main(argv):
    nonce = argv.pop(0)
    del sys.argv[1:]
    sys.path.insert(0, os.getcwd())
    files = argv or sorted(glob.glob("test_*.py") + glob.glob("tests/test_*.py"))
    passed, failures = 0, []
    for path in files:
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        except BaseException as exc:  # a test file that does not import fails as a whole
            failures.append({"test": path, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for attr in sorted(vars(mod)):
            fn = getattr(mod, attr)
            if attr.startswith("test_") and callable(fn) and getattr(fn, "__module__", None) == name:
                try:
                    fn()
                    passed += 1
                except BaseException as exc:
                    tb = traceback.format_exc(limit=-2)
                    failures.append({"test": f"{path}::{attr}", "error": f"{type(exc).__name__}: {exc}", "tb": tb[-800:]})
    print(json.dumps({"nonce": nonce, "passed": passed, "failed": len(failures), "failures": failures[:10]}))
    return 0 if passed and not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
