"""A TPU plan from the compiler's HLO passes alone, its code generation never run.

XLA's TPU compiler first runs the HLO passes (SPMD partitioning, fusion, scheduling) and assigns
every buffer a place in HBM; then it generates the chips' code. A plan reads only what the first
part decides: the optimized module (the roofline, FLOPs with loop trip counts) and the buffer
assignment (memory). The second part is most of a compile: llama3-8b on v5e-64 wrote its
buffer assignment 4 s into a 92 s compile (benchmarks/RESULTS.md, "Plans from the HLO passes").

`build_plan_program` compiles the step in a child process with an XLA dump, reads the module and
the buffer assignment from the dump as soon as both are written, and kills the child. Its
figures are the full compile's (tests/search/planning/test_hlo_passes.py, benchmarks/bench_plan_method.py),
except the generated code's bytes, which only code generation knows: the plan counts
`CODE_BYTES_BOUND` for them, above every program measured (MemoryEstimate.generated_code_bytes;
3 MB on the tests' tiny steps, 40-53 MB on the published rows'), so its peak is at or a little above the
full compile's and a step it says fits does fit.

The child needs ~2.5 s of imports before it can lower anything; so that a worker planning
trial after trial does not wait for them each time, the next child is started as soon as a plan
is read (from the process's second plan on) and waits, imported, for its spec (`_standby`).

Only for compile-only TPU devices (a topology planned on a machine without TPUs); elsewhere a
step is compiled in full (trainer/plan.py build_program).

    python -m paxsearch.search.planning.hlo_passes < SPEC_PATH     # the child (what build_plan_program runs)
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

from ...trainer import config as config_lib
from ...trainer import plan as plan_lib
from ...trainer.compile_cache import no_persistent_cache_writes
from ...trainer.errors import TrainerError
from ...trainer.results import FLOPS_FROM_HLO, MemoryEstimate
from .roofline import step_work
from .roofline.host import HOST_MEMORY_SPACE
from .topology import PredictedOOM, chip_for_device_kind, predicted_oom_from, topology_devices

MODULE = "jit_train_step"  # the dumped module of step.make_train_step's jitted step
BUFFERS = ".after_optimizations-buffer-assignment.txt"
OPTIMIZED = ".after_optimizations.txt"
# written after the two above: both are complete once it exists
WRITTEN_AFTER = ".after_optimizations_after_buffer_assignment.txt"
LOWERED = "lowered.json"  # the child writes its lowering time here, in the plan's folder
# the generated code's bytes a plan from the passes counts: above every program measured
# (benchmarks/bench_plan_method.py: 3 MB for the tests' tiny step, 40-53 MB on the published rows)
CODE_BYTES_BOUND = 64 << 20
HOST_COLOR = HOST_MEMORY_SPACE  # buffer-assignment colors are memory spaces: host memory, S(5) in layouts
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*)$", re.M)


class PassesError(TrainerError, RuntimeError):
    """The HLO passes could not give a plan (the child failed, or the dump lacks what a plan needs)."""


def memory_from_buffers(text: str) -> MemoryEstimate:
    """compiled.memory_analysis()'s figures from a buffer-assignment dump: arguments (entry
    parameters), outputs (maybe-live-out) and aliased (both) of HBM, as the full compile counts
    them (an offloaded parameter, in host memory, is no HBM argument); temporaries
    (preallocated-temp of HBM, host temporaries of the host color); the generated code at
    CODE_BYTES_BOUND (never generated)."""
    argument = output = alias = temp = host_temp = 0
    for size_text, rest in _ALLOCATION.findall(text):
        size = int(size_text)
        color = re.search(r"\bcolor (\d+)", rest)
        space = int(color.group(1)) if color else 0
        parameter = re.search(r"\bparameter \d+", rest) is not None
        live_out = "maybe-live-out" in rest
        if space == 0 and parameter:
            argument += size
            alias += size if live_out else 0
        output += size if live_out and space == 0 else 0
        if "preallocated-temp" in rest:
            if space == 0:
                temp += size
            elif space == HOST_COLOR:
                host_temp += size
    if argument == 0 and output == 0:
        raise PassesError("the buffer-assignment dump names no parameter and no output")
    return MemoryEstimate(argument_bytes=argument, output_bytes=output, temp_bytes=temp, alias_bytes=alias,
                          generated_code_bytes=CODE_BYTES_BOUND, host_temp_bytes=host_temp)


def build_plan_program(cfg: config_lib.TrainConfig, devices: Sequence, slice_name: str, num_slices: int = 1,
                       timeout: float | None = None) -> plan_lib.Program:
    """The Program (no compiled step) of `cfg` on the compile-only TPU `devices` of `num_slices`
    slices `slice_name`, from the HLO passes (module docstring). Raises PredictedOOM when the
    compiler refuses the step for memory, ConfigError before anything runs, PassesError when
    the passes give no plan (the caller can compile in full)."""
    devices, platform, global_batch, mesh, rules = plan_lib.setup(cfg, devices)
    if not plan_lib.compile_only(devices) or platform != "tpu":
        raise PassesError("the HLO passes plan compile-only TPU devices only")
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="paxsearch-passes-") as folder:
        t0 = time.perf_counter()
        child = _take_child(_write_spec(cfg, slice_name, num_slices, folder))
        try:
            # shapes and shardings only: the child lowers and compiles the step
            model, tx, schedule, placement, batch_sh, abstract_state, batch, _ = plan_lib.lower_step(
                cfg, mesh, global_batch, rules, platform, phases={}, lower=False)
            buffers, hlo_text = _wait_for_dump(child, folder, t0, timeout)
        finally:
            child.stop()
            global _plans
            _plans += 1
            # the next plan's child, refused or not; from a process's second plan on, so that one-plan
            # processes (a one-trial study's worker) do not import it for nothing
            if _plans >= 2 and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                _start_standby()
        # the child's lowering (from its start), then the rest of the wait: its compile
        phases["lower_s"] = _child_lower_s(folder)
        phases["compile_s"] = time.perf_counter() - t0 - phases["lower_s"]
    t1 = time.perf_counter()
    work = step_work(hlo_text)
    if work.unknown_trip_counts:
        raise PassesError(f"loops without a readable trip count in the optimized module: {work.unknown_trip_counts}")
    memory = memory_from_buffers(buffers)
    _refuse_like_the_compiler(memory, devices[0])
    phases["hlo_text_s"] = time.perf_counter() - t1
    phases["flop_probes_s"] = 0.0
    plan = plan_lib.plan_result(cfg, devices, mesh, global_batch, abstract_state, memory, phases,
                                hlo_text=hlo_text, hlo_source="xla_dump", hlo_error=None,
                                xla_flops=work.flops_per_step, xla_bytes=work.hbm_bytes_per_step,
                                flops_source=FLOPS_FROM_HLO)
    return plan_lib.Program(cfg, mesh, model, tx, schedule, placement.stored, batch_sh, abstract_state, batch,
                            None, plan, rules, placement.device)


def _refuse_like_the_compiler(memory: MemoryEstimate, device) -> None:
    """Raise the PredictedOOM the full compile would: the TPU compiler refuses a step whose
    buffers (arguments, outputs, temporaries; no code) exceed the chip's usable HBM, right after
    the buffer assignment the passes read (RESOURCE_EXHAUSTED, CompileTimeHbmOom)."""
    chip = chip_for_device_kind(getattr(device, "device_kind", ""))
    required = memory.peak_bytes - memory.generated_code_bytes
    if chip is None or required <= chip.hbm_bytes:
        return
    raise PredictedOOM(f"predicted OOM: the step needs {required / 2**30:.2f} GiB per device, the chip has "
                       f"{chip.hbm_bytes / 2**30:.2f} GiB usable HBM (XLA's TPU compiler, buffer assignment: "
                       "over the HBM, which it refuses)", required, chip.hbm_bytes, "compiler")


class _Child:
    """A child process that has imported what a plan needs and waits for a spec on its stdin."""

    def __init__(self):
        fd, self.log = tempfile.mkstemp(prefix="paxsearch-passes-", suffix=".log")
        self.env = dict(os.environ)  # the compiler flags it will compile with
        module = __spec__.name if __spec__ else "paxsearch.search.planning.hlo_passes"
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=fd,
                                         stderr=subprocess.STDOUT, text=True)
        finally:
            os.close(fd)

    def send(self, spec_path: str) -> bool:
        """Hand the child its spec; False when it cannot take one (gone, or started with another env)."""
        stdin = self.proc.stdin
        if stdin is None or self.proc.poll() is not None or self.env != dict(os.environ):
            return False
        try:
            stdin.write(spec_path + "\n")
            stdin.close()
        except (BrokenPipeError, OSError):
            return False
        return True

    def tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:].strip()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):  # the pipe of a killed child
            if self.proc.stdin:
                self.proc.stdin.close()
        with contextlib.suppress(OSError):  # a log already gone
            os.unlink(self.log)


_standby: _Child | None = None  # the next plan's child, started when the last plan was read
_plans = 0  # plans this process has made


def _take_child(spec_path: str) -> _Child:
    """The standby child, handed `spec_path`; a fresh one where there is none it can use."""
    global _standby
    child, _standby = _standby, None
    if child is not None and child.send(spec_path):
        return child
    if child is not None:
        child.stop()
    child = _Child()
    if not child.send(spec_path):
        why = child.tail()
        child.stop()
        raise PassesError(f"the HLO-passes child did not start: {why}")
    return child


def _start_standby() -> None:
    global _standby
    if _standby is None:
        _standby = _Child()


@atexit.register
def _stop_standby() -> None:
    global _standby
    if _standby is not None:
        _standby.stop()
        _standby = None


def _write_spec(cfg, slice_name: str, num_slices: int, folder: str) -> str:
    spec = os.path.join(folder, "spec.json")
    with open(spec, "w") as f:
        json.dump({"config": config_lib.to_dict(cfg), "slice": slice_name, "slices": num_slices,
                   "dump": os.path.join(folder, "dump"), "result": os.path.join(folder, "result.json")}, f)
    return spec


def _dumped(folder: str, suffix: str) -> str | None:
    dump = os.path.join(folder, "dump")
    try:
        names = os.listdir(dump)
    except FileNotFoundError:
        return None
    found = [n for n in names if f".{MODULE}." in n and n.endswith(suffix)]
    return os.path.join(dump, found[0]) if len(found) == 1 else None


def _wait_for_dump(child: _Child, folder: str, t0: float, timeout: float | None) -> tuple[str, str]:
    """(buffer assignment, optimized module) once the child's dump holds both."""
    while True:
        exited = child.proc.poll() is not None
        if _dumped(folder, WRITTEN_AFTER) or exited:
            buffers, optimized = _dumped(folder, BUFFERS), _dumped(folder, OPTIMIZED)
            if buffers and optimized:
                with open(buffers) as b, open(optimized) as o:
                    return b.read(), o.read()
            if exited:
                raise _child_failure(folder, child)
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise PassesError(f"the HLO passes wrote no buffer assignment within {timeout:.0f} s")
        time.sleep(0.05)


def _child_lower_s(folder: str) -> float:
    """The seconds the child took to lower the step (0.0 when it wrote none)."""
    try:
        with open(os.path.join(folder, LOWERED)) as f:
            return float(json.load(f)["lower_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _child_failure(folder: str, child: _Child) -> Exception:
    """The child's error as the compile's own would be raised: PredictedOOM or PassesError."""
    try:
        with open(os.path.join(folder, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        return PassesError(f"the HLO-passes child exited with {child.proc.returncode} and no result: {child.tail()}")
    if "oom" in result:
        return PredictedOOM(result["oom"]["message"], result["oom"]["required"], result["oom"]["available"],
                            "compiler")
    return PassesError(f"the compile failed: {result.get('error', 'no error text')}")


# ----------------------------------------------------------------------------- the child

def _exit_with_parent() -> None:
    """End this process when the process that started it is gone (a killed worker, Ctrl-C)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _child() -> int:
    """Wait (imported) for a spec path on stdin; lower and compile it with the XLA dump. Nothing on
    stdin (the parent gone, or it never needed this standby): exit."""
    _exit_with_parent()
    spec_path = sys.stdin.readline().strip()
    if not spec_path:
        return 0
    with open(spec_path) as f:
        spec = json.load(f)
    cfg = config_lib.from_dict(spec["config"])
    try:
        devices, platform, global_batch, mesh, rules = plan_lib.setup(
            cfg, topology_devices(spec["slice"], spec["slices"]))
        phases: dict[str, float] = {}
        *_, lowered = plan_lib.lower_step(cfg, mesh, global_batch, rules, platform, phases=phases)
        with open(os.path.join(os.path.dirname(spec["result"]), LOWERED), "w") as f:
            json.dump({"lower_s": phases["lower_s"]}, f)
        with no_persistent_cache_writes(), plan_lib.mesh_context(mesh, rules):
            lowered.compile(compiler_options=plan_lib.dump_options(spec["dump"]))
    except Exception as e:  # reported to the parent as data; it raises the same kind
        oom = predicted_oom_from(e)
        result = ({"oom": {"message": str(oom), "required": oom.required_bytes, "available": oom.available_bytes}}
                  if oom is not None else {"error": plan_lib.first_line(e)})
        with open(spec["result"], "w") as f:
            json.dump(result, f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child())
