"""Fresh kernels without the import cost: each one forked from a process that imported PyTorch once.

A notebook of the course spends most of its first seconds importing: PyTorch, ``torch._dynamo`` (which
the checks' device test pulls in), ``mha_lib``, matplotlib and the kernel itself, 5 to 7 s of CPU on a
quiet 2-core machine, for every notebook. ``grade`` runs up to 12 notebooks per student, ``make progress``
a learner's 12, and ``make test`` 36 under nbval (the repository's conftest.py), so they ask for their
kernels here: a *fork server* (this module run as ``python -m mha_course.progress.forking``) imports
those modules once, and each kernel is a ``fork()`` of it that then starts ``ipykernel`` exactly as
``python -m ipykernel_launcher -f CONNECTION_FILE`` would, in the notebook's folder, with the
environment it was given. Nothing of one notebook reaches another: every kernel is a new process, forked
from a server that only imported modules (it never runs a notebook's code, nor any PyTorch operation).
What a kernel finds already imported is what the notebook's own first cell imports.

``FORK_PRELOAD`` names the modules; one that can't be imported is left out. POSIX only (``fork``); where
the server can't start, :func:`kernel_manager_class` returns None and the kernels start as usual.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

__all__ = ["FORK_PRELOAD", "ForkServer", "kernel_manager_class"]

FORK_PRELOAD = ("torch", "torch._dynamo", "mha_lib", "mha_lib.checks", "matplotlib", "matplotlib.pyplot",
                "ipykernel.kernelapp")
_INLINE = "module://matplotlib_inline.backend_inline"  # what ipykernel sets unless MPLBACKEND is set


class ForkServer:
    """The server process, and the requests this process sends it (one at a time)."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mha_course.progress.forking"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=self.env, text=True, bufsize=1, cwd=Path(__file__).resolve().parents[2])
        ready = self.process.stdout.readline()
        if not ready.startswith("{"):
            self.close()
            raise OSError(f"the fork server did not start ({ready.strip() or 'no answer'})")
        self.preloaded = json.loads(ready).get("preloaded", [])

    def _ask(self, request: dict) -> dict:
        with self._lock:
            if self.process.poll() is not None:
                raise OSError("the fork server has stopped")
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = json.loads(self.process.stdout.readline() or "{}")
        if "error" in answer or not answer:
            raise OSError(f"the fork server could not {request['op']}: {answer.get('error', 'no answer')}")
        return answer

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        return int(self._ask({"op": "spawn", "argv": argv, "env": env, "cwd": cwd})["pid"])

    def poll(self, pid: int) -> int | None:
        return self._ask({"op": "poll", "pid": pid})["code"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # the server ends when its input does
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


class _Forked:
    """A forked kernel, as jupyter_client's provisioner uses a ``subprocess.Popen``."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, server: ForkServer):
        self.pid, self._server, self.returncode = pid, server, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._server.poll(self.pid)
            except OSError:  # the server is gone, and so are its children's exit codes
                self.returncode = -signal.SIGKILL if not _alive(self.pid) else None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


_servers: dict[tuple, ForkServer] = {}
_failed: set[tuple] = set()
_servers_lock = threading.Lock()  # kernels may start from several threads at once (grade's jobs)


def _server(env: dict[str, str]) -> ForkServer | None:
    """The fork server for kernels of this environment's thread settings (started once), or None."""
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(("OMP_", "MKL_", "ATEN_", "MHA_DEVICE"))))
    with _servers_lock:
        if key in _failed:
            return None
        server = _servers.get(key)
        if server is None or server.process.poll() is not None:
            try:
                server = _servers[key] = ForkServer(env)
            except (OSError, ValueError):
                _failed.add(key)
                return None
        return server


@atexit.register
def _close_servers() -> None:
    for server in _servers.values():
        server.close()


def kernel_manager_class(env: dict[str, str], blocking: bool = False) -> type | None:
    """A kernel manager whose kernels are forked, or None where this platform can't fork or the server
    would not start.

    ``blocking=False``: an ``AsyncKernelManager``, for nbclient's ``kernel_manager_class``;
    ``blocking=True``: a ``KernelManager``, as nbval starts its kernels with. Each kernel is forked from
    the server for the environment it is started with (its thread and device settings); where that
    server can't start, the kernel starts from scratch, as it would without this class.
    """
    if not hasattr(os, "fork") or sys.platform == "win32":
        return None
    if _server(env) is None:
        return None
    from jupyter_client.manager import AsyncKernelManager, KernelManager
    from jupyter_client.provisioning import LocalProvisioner

    class ForkProvisioner(LocalProvisioner):  # type: ignore[misc]
        async def launch_kernel(self, cmd: list[str], **kwargs: Any):  # noqa: ANN202
            kernel_env = dict(kwargs.get("env") or os.environ)
            server = _server(kernel_env)
            if server is None:
                return await super().launch_kernel(cmd, **kwargs)
            pid = server.spawn(list(cmd), kernel_env, str(kwargs.get("cwd") or Path.cwd()))
            self.process = _Forked(pid, server)
            self.pid = self.pgid = pid  # the kernel leads a session of its own: its children are killed with it
            self.cwd = kwargs.get("cwd", Path.cwd())
            return self.connection_info

    class ForkingKernelManager(KernelManager if blocking else AsyncKernelManager):  # type: ignore[misc]
        async def _async_pre_start_kernel(self, **kw: Any):  # noqa: ANN202
            if self.provisioner is None:
                self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
                self.provisioner = ForkProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec,
                                                   parent=self)
            return await super()._async_pre_start_kernel(**kw)

    return ForkingKernelManager


# ------------------------------------------------------------------------------------------- the server

def _child(request: dict) -> None:
    """In the forked process: become what ``python -m ipykernel_launcher -f FILE`` is, then run it."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # A new process draws new random numbers: the generators the server holds are seeded afresh, as
        # in a kernel started from scratch (Python's own `random` is, by Python, at every fork).
        if "torch" in sys.modules:
            sys.modules["torch"].seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        argv = list(request["argv"])  # [python, "-m", "ipykernel_launcher", "-f", FILE]
        start = next((i for i, a in enumerate(argv) if Path(a).stem == "ipykernel_launcher"), None)
        args = argv[start + 1:] if start is not None else argv[1:]
        sys.argv = [request["launcher"]] + args  # as `python -m ipykernel_launcher` sets it
        from ipykernel import kernelapp

        kernelapp.launch_new_instance(argv=args)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0
    except BaseException:  # noqa: BLE001 - nothing to tell: the client sees the kernel die
        code = 1
    finally:
        os._exit(code)


def _serve() -> None:
    # As ipykernel_launcher: the folder it was started in is not on the path (the kernel adds its own).
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    os.environ.setdefault("MPLBACKEND", _INLINE)
    import importlib
    import importlib.util

    preloaded = []
    for name in FORK_PRELOAD:
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except Exception:  # noqa: BLE001 - a module missing here is imported by the kernel, as usual
            pass
    del os.environ["MPLBACKEND"]  # each kernel sets it again, as ipykernel does
    spec = importlib.util.find_spec("ipykernel_launcher")
    launcher = spec.origin if spec and spec.origin else "ipykernel_launcher.py"
    children: dict[int, int | None] = {}
    out = sys.stdout
    out.write(json.dumps({"preloaded": preloaded}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request["op"] == "spawn":
                request["launcher"] = launcher
                pid = os.fork()
                if pid == 0:
                    _child(request)
                children[pid] = None
                answer: dict = {"pid": pid}
            elif request["op"] == "poll":
                pid = int(request["pid"])
                if children.get(pid) is None:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        children[pid] = os.waitstatus_to_exitcode(status)
                answer = {"code": children.get(pid)}
            else:
                answer = {"error": f"unknown request {request['op']!r}"}
        except Exception as error:  # noqa: BLE001 - the client raises it
            answer = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    for pid, code in children.items():  # input closed: the grading is over; reap what is left
        if code is None:
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


if __name__ == "__main__":
    _serve()
