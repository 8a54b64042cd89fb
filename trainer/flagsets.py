"""Named compiler flag sets: XLA_FLAGS and LIBTPU_INIT_ARGS a process sets before its backend starts.

A TrainConfig names one set (`flags="latency_hiding"`), so a flag set is a searchable decision
and an exported config carries it. The table is code, not user data: a config only ever
names a set, and adding a set is one entry below.

    check("latency_hiding")                          # ConfigError (one line) for an unknown name
    os.environ.update(env_for(name, "tpu"))          # before JAX starts its backend
    applied(name, os.environ)                        # True when this process runs with the set
    validate(name, "cpu")                            # the installed XLA knows every flag (a probe)

XLA aborts the whole process on a flag it does not know ("Unknown flag in XLA_FLAGS"), and
flags come and go between jaxlib / libtpu versions, so `validate` starts a throw-away
process with the set applied and turns that abort into one ConfigError line.

LIBTPU_INIT_ARGS is read by libtpu only: it applies on the "tpu" platform, including
compile-only TPU topologies (plan mode), and is left out elsewhere. XLA_FLAGS apply on
every platform (a `--xla_gpu_*` flag is known to every jaxlib and ignored off GPU).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from .errors import ConfigError

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
SET_ENV = "PAXSEARCH_FLAG_SET"  # the name of the set a process was started with


def with_device_count(xla_flags: str | None, n: int | None) -> str:
    """`xla_flags` (an XLA_FLAGS value) with the host platform's device count set to `n`
    simulated CPU devices: any count already there is replaced. n None: only removed (the
    flags of one's own)."""
    kept = [f for f in (xla_flags or "").split() if f.split("=", 1)[0] != DEVICE_COUNT_FLAG]
    if n is not None:
        kept.append(f"{DEVICE_COUNT_FLAG}={int(n)}")
    return " ".join(kept)


@dataclass(frozen=True)
class FlagSet:
    xla_flags: tuple[str, ...]  # added to XLA_FLAGS (every platform)
    libtpu_init_args: tuple[str, ...]  # added to LIBTPU_INIT_ARGS (platform "tpu" only)
    description: str
    source: str

    def as_dict(self) -> dict:
        return {"XLA_FLAGS": list(self.xla_flags), "LIBTPU_INIT_ARGS": list(self.libtpu_init_args)}


# Paxml's multi-slice C4 runs (the seeds: paxml docs, "multislice" section) and MaxText's
# benchmarks/xla_flags_library.py (CF_FOR_ALL_GATHER, DATA_PARALLEL_OVERLAP) are the sources
# of the TPU sets; JAX's "GPU performance tips" page of the GPU one.
FLAG_SETS: dict[str, FlagSet] = {
    "default": FlagSet((), (), "no flags added: the compiler's defaults", "-"),
    "latency_hiding": FlagSet(
        ("--xla_gpu_enable_latency_hiding_scheduler=true",),
        ("--xla_tpu_enable_latency_hiding_scheduler=true", "--xla_enable_async_all_gather=true"),
        "latency-hiding scheduler and async all-gather: overlap collectives with compute (TPU, GPU)",
        "Paxml multi-slice LIBTPU_INIT_ARGS (seeds); JAX GPU performance tips"),
    "paxml_multislice": FlagSet(
        (),
        ("--xla_jf_spmd_threshold_for_windowed_einsum_mib=0", "--xla_tpu_spmd_threshold_for_allgather_cse=10000",
         "--xla_enable_async_all_gather=true", "--xla_tpu_enable_latency_hiding_scheduler=true"),
        "Paxml's multi-slice C4 runs: windowed einsums, all-gather CSE threshold, async all-gather, LHS (TPU)",
        "Paxml multi-slice launch commands (seeds: C4Spmd22BAdam2xv4_128)"),
    "collective_fusion": FlagSet(
        (),
        ("--xla_tpu_enable_async_collective_fusion=true",
         "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true", "--xla_tpu_overlap_compute_collective_tc=true",
         "--xla_enable_async_all_gather=true", "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
         "--xla_tpu_data_parallel_opt_different_sized_ops=true"),
        "continuation fusion of all-gathers and data-parallel all-reduce overlap (TPU)",
        "MaxText benchmarks/xla_flags_library.py: CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP"),
    "v5p_collectives": FlagSet(
        (),
        ("--xla_tpu_megacore_fusion_allow_ags=false", "--xla_enable_async_collective_permute=true",
         "--xla_tpu_enable_ag_backward_pipelining=true", "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
         "--xla_tpu_data_parallel_opt_different_sized_ops=true", "--xla_tpu_enable_async_collective_fusion=true",
         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
         "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true"),
        "v5p: async collective-permutes (tensor-axis windowed einsums), all-gather backward pipelining, "
        "collective fusion without the all-gather continuation fusion the v5p compiler refuses (TPU)",
        "MaxText MaxText/configs/v5p/32b.sh and 64b.sh @76bd53b0 (2023-12-15) LIBTPU_INIT_ARGS"),
    "cpu_eigen_dots": FlagSet(
        ("--xla_cpu_experimental_ynn_fusion_type=",),
        (),
        "CPU: matmuls through XLA's own (Eigen) dot emitter instead of YNNPACK library fusions",
        "XLA debug_options_flags.cc (xla_cpu_experimental_ynn_fusion_type; empty = no library fusion)"),
}


def names() -> list[str]:
    return list(FLAG_SETS)


def check(name) -> FlagSet:
    """The set called `name`; ConfigError (one line, listing the sets) when there is none."""
    if not isinstance(name, str) or name not in FLAG_SETS:
        raise ConfigError(f"unknown compiler flag set {name!r}; choose one of {', '.join(FLAG_SETS)} "
                          "(trainer/flagsets.py)")
    return FLAG_SETS[name]


def describe(name: str) -> str:
    s = check(name)
    flags = " ".join(s.xla_flags + s.libtpu_init_args) or "no flags"
    return f"{name}: {s.description} [{flags}] (source: {s.source})"


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def _merge(existing: str, added: tuple[str, ...]) -> str:
    """`existing` flags with `added` laid over them (a flag of the same name is replaced)."""
    replaced = {_flag_name(f) for f in added}
    kept = [f for f in existing.split() if _flag_name(f) not in replaced]
    return " ".join(kept + list(added))


def env_for(name: str, platform: str | None, base_env=None) -> dict[str, str]:
    """XLA_FLAGS / LIBTPU_INIT_ARGS (and SET_ENV) of `base_env` (default os.environ) with the
    set's flags merged in; a process started with them runs with the set. The flags already
    there stay, --xla_force_host_platform_device_count among them; a flag the set also names
    takes the set's value. platform: "cpu" | "gpu" | "tpu" (LIBTPU_INIT_ARGS on "tpu" only),
    or None for every platform."""
    s = check(name)
    base = os.environ if base_env is None else base_env
    env = {"XLA_FLAGS": _merge(base.get("XLA_FLAGS", ""), s.xla_flags), SET_ENV: name}
    if platform in (None, "tpu"):
        env["LIBTPU_INIT_ARGS"] = _merge(base.get("LIBTPU_INIT_ARGS", ""), s.libtpu_init_args)
    return env


def applied(name: str, environ=None, platform: str | None = "cpu") -> bool:
    """True when every flag of the set is in `environ` (default os.environ) with the set's
    value (its LIBTPU_INIT_ARGS only when `platform` is "tpu" or None)."""
    s = check(name)
    env = os.environ if environ is None else environ
    have_xla = set(env.get("XLA_FLAGS", "").split())
    have_tpu = set(env.get("LIBTPU_INIT_ARGS", "").split())
    need_tpu = s.libtpu_init_args if platform in (None, "tpu") else ()
    return set(s.xla_flags) <= have_xla and set(need_tpu) <= have_tpu


# ----------------------------------------------------------------------------- validation

PROBE_TIMEOUT_S = 300.0
_VALID: dict[tuple, None] = {}


def _probe_code(tpu_slice: str | None) -> str:
    if tpu_slice:  # compile-only TPU devices: libtpu reads LIBTPU_INIT_ARGS when it loads
        return ("from paxsearch.trainer.topology import topology_devices; "
                f"topology_devices({tpu_slice!r})")
    return "import jax; jax.devices()"


def _first_complaint(stderr: str) -> str:
    """The line of a failed start that says what is wrong (XLA's fatal/error log lines start
    with a severity letter and a date; libtpu prints 'ERROR: ...')."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if "nknown" in ln and "flag" in ln:
            return ln.split("] ", 1)[-1]
    for ln in lines:
        if ln[:1] in "EF" and ln[1:5].isdigit() or ln.startswith("ERROR"):
            return ln.split("] ", 1)[-1]
    return lines[-1] if lines else "no output"


def validate(name: str, platform: str, base_env=None, tpu_slice: str | None = None,
             compile_only: bool = False) -> None:
    """Start a throw-away process with the set applied and its backend started; ConfigError
    (one line) when XLA or libtpu refuses a flag. Each (set, platform, flags) is probed once
    per process. tpu_slice: for a compile-only TPU target (plan mode), load its topology.
    compile_only: a plan-only target (no such device here): the flags are probed on the CPU
    backend, which parses the same XLA flags (a GPU node planned without GPUs)."""
    check(name)
    base = dict(os.environ if base_env is None else base_env)
    env = {**base, **env_for(name, platform, base)}
    if platform == "cpu" or tpu_slice or compile_only:  # compile-only devices need no TPU/GPU backend
        env["JAX_PLATFORMS"] = "cpu"
    key = (name, platform, tpu_slice, compile_only, env.get("XLA_FLAGS"), env.get("LIBTPU_INIT_ARGS"))
    if key in _VALID:
        return
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        proc = subprocess.run([sys.executable, "-c", _probe_code(tpu_slice)], env=env, capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"compiler flag set {name!r}: a backend with these flags did not start within "
                          f"{PROBE_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        what = "LIBTPU_INIT_ARGS" if platform == "tpu" and env.get("LIBTPU_INIT_ARGS") else "XLA_FLAGS"
        raise ConfigError(f"compiler flag set {name!r} cannot start a {platform} backend "
                          f"({what}={env.get(what, '')!r}): {_first_complaint(proc.stderr)[:300]}; "
                          f"fix or drop the flag (trainer/flagsets.py, or the {what} of your shell)")
    _VALID[key] = None
