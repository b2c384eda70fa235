"""A memory and process cap for a sandboxed run's whole process tree: one cgroup per run.

rlimits are per process (RLIMIT_AS) or per uid (RLIMIT_NPROC): three processes of 600 MB each pass a
1 GB RLIMIT_AS. A cgroup counts the tree together, tmpfs pages it writes included. We make one under our
own cgroup, for v2 (memory.max, pids.max) or v1 (memory/ and pids/ hierarchies), put the sandbox's first
process in it before it forks (the sandbox starts through `sh -c 'echo $$ > cgroup.procs; exec ...'`),
and remove it after the run, killing whatever is left in it.

Where no writable cgroup with those controllers exists (an unprivileged user, a container without
delegation), `TreeCap.make` returns a cap with no files: the run goes on with rlimits only and its
`isolation` lacks "cgroup", so a report never claims a cap that did not hold. What holds then: each
process is held to RLIMIT_AS and the run's uid to RLIMIT_NPROC processes, so nproc x memory_mb bounds
the tree.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own(controller: str) -> str | None:
    """Our cgroup path for a v1 controller ("memory"), or the v2 path for controller ""."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _hid, ctrls, path = line.split(":", 2)
        if (controller == "" and ctrls == "") or controller in ctrls.split(","):
            return path
    return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass
class TreeCap:
    dirs: list[Path] = field(default_factory=list)  # the run's cgroup folders (one for v2, two for v1)
    procs: list[Path] = field(default_factory=list)  # where the first process writes its pid

    @property
    def active(self) -> bool:
        return bool(self.procs)

    @classmethod
    def make(cls, memory_mb: int, pids: int) -> TreeCap:
        name = f"rtrl-sbx-{secrets.token_hex(6)}"
        mem = memory_mb * 1024 * 1024
        cap = cls._v2(name, mem, pids) or cls._v1(name, mem, pids)
        return cap or cls()

    @classmethod
    def _v2(cls, name: str, mem: int, pids: int) -> TreeCap | None:
        own = _own("")
        if own is None or not (ROOT / "cgroup.controllers").is_file():
            return None
        parent = ROOT / own.lstrip("/")
        wanted = {"memory", "pids"}
        try:
            if not wanted <= set((parent / "cgroup.subtree_control").read_text().split()):
                return None
            d = parent / name
            d.mkdir()
        except OSError:
            return None
        cap = cls([d], [d / "cgroup.procs"])
        if not (_write(d / "memory.max", str(mem)) and _write(d / "pids.max", str(pids))):
            cap.close()
            return None
        _write(d / "memory.swap.max", "0")  # no swap either, where swap accounting is on
        return cap

    @classmethod
    def _v1(cls, name: str, mem: int, pids: int) -> TreeCap | None:
        paths = {c: _own(c) for c in ("memory", "pids")}
        if any(p is None or not (ROOT / c).is_dir() for c, p in paths.items()):
            return None
        cap = cls()
        for ctrl, own in paths.items():
            d = ROOT / ctrl / own.lstrip("/") / name
            try:
                d.mkdir()
            except OSError:
                cap.close()
                return None
            cap.dirs.append(d)
            cap.procs.append(d / "cgroup.procs")
        mem_dir, pids_dir = cap.dirs
        if not (_write(mem_dir / "memory.limit_in_bytes", str(mem)) and _write(pids_dir / "pids.max", str(pids))):
            cap.close()
            return None
        _write(mem_dir / "memory.memsw.limit_in_bytes", str(mem))  # no swap either, where swap accounting is on
        return cap

    def wrap(self, argv: list[str]) -> list[str]:
        """argv started inside the cap: a shell joins it, then execs argv (exit 121 if it cannot join)."""
        if not self.active:
            return argv
        join = "; ".join(f"echo $$ > '{p}' || exit 121" for p in self.procs)
        return ["/bin/sh", "-c", f"{join}; exec \"$@\"", "sh", *argv]

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of the run for the memory cap."""
        for d in self.dirs:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    for line in (d / name).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == key and int(v or 0) > 0:
                            return True
                except (OSError, ValueError):
                    continue
        return False

    def close(self) -> None:
        """Kill what is left in the run's cgroups (a fork bomb's orphans), then remove them."""
        for d in self.dirs:
            for _ in range(50):
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.01)
        for d in list(self.dirs):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                continue  # a process not yet reaped: the next close removes it
            i = self.dirs.index(d)
            del self.dirs[i], self.procs[i]
