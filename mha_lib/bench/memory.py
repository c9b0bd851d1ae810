"""Peak memory of one step: the CUDA allocator's own count, or the peak RSS of a separate CPU process.

**CUDA**: ``torch.cuda.reset_peak_memory_stats`` and ``torch.cuda.max_memory_allocated``, the
caching allocator's count of live tensor bytes, in this process. The peak rise is measured
above what was allocated just before the step (inputs, weights).

**CPU**: PyTorch has no public count of the CPU memory its tensors take, so the benchmark
asks the operating system. The steps run in a **separate Python process**, a worker started on
first use (and then reused, so that PyTorch is imported once), which reads its own memory from
Linux's ``/proc/self/status``: ``VmRSS``, the resident set size just before the measured call, and
``VmHWM``, its high-water mark, reset by writing ``5`` to ``/proc/self/clear_refs``. The peak
rise is ``VmHWM - VmRSS``. Limits:

- Linux only; elsewhere the CPU memory is not measured (None, shown as "-").
- The step is sent to the worker by :mod:`pickle`: a :class:`~mha_lib.bench.Step`, a
  module-level function or a ``functools.partial`` of one; a closure or a lambda is refused.
- It counts every page the process touches: tensors, and also the buffers that libraries such
  as oneDNN or OpenMP take with their own ``malloc``, and pages of thread stacks (more than
  the tensor bytes, and closer to what the machine must have).
- The step is called once first (a warm-up: lazy set-up, kernel caches); the second call is
  measured.
- glibc keeps freed memory to reuse it, which would hide part of a later peak. The worker runs
  with ``MALLOC_MMAP_THRESHOLD_=65536``: every block of 64 KiB or more is mapped on its own and
  returned to the system when freed. Smaller blocks still come from the heap, so the result
  may be off by the heap's free space (typically well under 1 MiB).
- Pages, not bytes: RSS grows in 4 KiB steps. The worker uses as many threads as this process.

Other devices: not measured (None).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence

import torch

from .timing import synchronize

__all__ = ["cpu_memory_supported", "free_memory", "peak_memories", "peak_memory", "start_memory_worker"]

Step = Callable[[], None]

# The worker: set sys.path from argv, then answer requests on stdin until it closes.
_WORKER = """
import json, sys
sys.path[:] = json.loads(sys.argv[1])
from mha_lib.bench.memory import _serve
_serve()
"""


def _status(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} line")


def cpu_memory_supported() -> bool:
    """Whether this system lets a process read and reset its peak RSS (Linux's /proc)."""
    return os.path.exists("/proc/self/status") and os.access("/proc/self/clear_refs", os.W_OK)


def _measure(blob: bytes) -> int:
    """In the worker: call the step once (warm-up), then measure its second call's peak RSS rise."""
    step = pickle.loads(blob)
    step()
    gc.collect()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    step()
    peak = _status("VmHWM")
    del step
    gc.collect()
    return max(0, peak - before)


def _serve() -> None:
    """The worker's loop: a request is (threads, [pickled step, ...]), the answer one JSON line."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the steps print goes to stderr, not into the answers
    gc.collect()
    gc.freeze()  # PyTorch's objects live as long as the worker: _measure's collections skip them (0.1 s each otherwise)
    while header := sys.stdin.buffer.read(8):
        threads, blobs = pickle.loads(sys.stdin.buffer.read(int.from_bytes(header, "big")))
        torch.set_num_threads(threads)
        try:
            answer = {"peaks": [_measure(blob) for blob in blobs]}
        except Exception as error:  # noqa: BLE001 - reported to the caller, who raises it
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _pickled(step: Step) -> bytes:
    try:
        return pickle.dumps(step)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(
            f"on the CPU, peak memory is measured in another process, which needs a step it can pickle: "
            f"a mha_lib.bench.Step, a module-level function or a functools.partial of one, not {step!r} ({error})"
        ) from None


_worker: subprocess.Popen | None = None


def _start_worker() -> subprocess.Popen:
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(sys.path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    atexit.register(_stop, worker)
    return worker


def _stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.stdin.close()
        worker.wait(timeout=10)


def _running_worker() -> subprocess.Popen:
    global _worker
    if _worker is None or _worker.poll() is not None:
        _worker = _start_worker()
    return _worker


def start_memory_worker(device: torch.device | str = "cpu") -> bool:
    """Start the CPU worker now, in the background, and return at once.

    The worker's first seconds go to importing PyTorch. :func:`peak_memories` starts it on
    first use anyway and waits for that; starting it early (chapter 10 does, in its set-up
    cell) lets the import overlap with other work. Does nothing for other devices or where
    the CPU memory cannot be measured. Returns whether a worker is running.
    """
    if torch.device(device).type != "cpu" or not cpu_memory_supported():
        return False
    _running_worker()
    return True


def _cpu_peaks(steps: Sequence[Step]) -> list[int | None]:
    if not cpu_memory_supported():
        return [None] * len(steps)
    request = pickle.dumps((torch.get_num_threads(), [_pickled(step) for step in steps]))
    worker = _running_worker()
    worker.stdin.write(len(request).to_bytes(8, "big") + request)
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError("the memory-measuring process ended without an answer (out of memory?)")
    answer = json.loads(line)
    if "error" in answer:
        raise RuntimeError(f"measuring the peak memory failed: {answer['error']}")
    return answer["peaks"]


def _cuda_peak(step: Step, device: torch.device) -> int:
    step()  # warm-up, as on the CPU
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def peak_memories(steps: Sequence[Step], device: torch.device | str = "cpu") -> list[int | None]:
    """Peak memory rise, in bytes, of one call of each step after a warm-up call (module docstring).

    CUDA: in this process. CPU: in the worker process, one step after the other (Linux only;
    None elsewhere). Other devices: None.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return [_cuda_peak(step, device) for step in steps]
    if device.type == "cpu":
        return _cpu_peaks(steps) if steps else []
    return [None] * len(steps)


def peak_memory(step: Step, device: torch.device | str = "cpu") -> int | None:
    """Peak memory rise, in bytes, of one call of ``step()`` after a warm-up call.

    See the module docstring: on the CPU ``step`` runs in another process, so it must be
    picklable (e.g. a :class:`~mha_lib.bench.Step`).
    """
    return peak_memories([step], device)[0]


def free_memory(device: torch.device | str) -> int | None:
    """Bytes the device can still allocate (CPU: MemAvailable of /proc/meminfo), or None."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None
