"""Named compiler flag sets: XLA_FLAGS and LIBTPU_INIT_ARGS a process sets before its backend starts.

A TrainConfig names one set (`flags="latency_hiding"`), so a flag set is a searchable decision
and an exported config carries it. The table is code, not user data: a config only ever
names a set, and adding a set is one entry below.

    check("latency_hiding")                          # ConfigError (one line) for an unknown name
    os.environ.update(env_for(name, "tpu"))          # before JAX starts its backend
    applied(name, os.environ)                        # True when this process runs with the set
    validate(name, "cpu")                            # the installed XLA knows every flag (a probe)
    check_target(name, "tpu", "v6e")                 # ConfigError (one line) for a set v6e does not take

Every set states the TPU generations it applies to (`generations`): libtpu's compiler refuses
some flags on some chips (all-gather continuation fusion is v5e-only: "Continuation fusion for
AllGather is enabled on platform ghost" on v6e), at compile time. The static check
(trainer/validate.py) refuses a set on a TPU generation it does not apply to before anything
compiles; `refusals` keeps the compiler's line for the generations it refuses. The table was
probed by compiling the tiny model with each set for v4-8, v5e-8, v5p-8 and v6e-8 topologies
(benchmarks/probe_flagsets.py; the table and the command in benchmarks/RESULTS.md). On CPU and
GPU every set applies: there only its XLA_FLAGS are read.

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
from dataclasses import dataclass, field

from .errors import ConfigError

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
SET_ENV = "PAXSEARCH_FLAG_SET"  # the name of the set a process was started with
# Simulated CPU devices run a collective's participants as threads of one process, and XLA:CPU
# aborts the whole process (SIGABRT, no Python error) when one of them is 60 s late (a 20 s
# warning, then 40 s more). On a machine busy with other trials' compiles a thread can wait
# that long (it took a test process down in CI); 10 minutes is beyond any busy machine's wait,
# and a real deadlock still ends. It changes no compiled program.
CPU_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
CPU_COLLECTIVE_TIMEOUT_S = 600


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def with_device_count(xla_flags: str | None, n: int | None) -> str:
    """`xla_flags` (an XLA_FLAGS value) with the host platform's device count set to `n`
    simulated CPU devices: any count already there is replaced, and the collectives' abort
    timeout is raised to CPU_COLLECTIVE_TIMEOUT_S unless the flags set their own. n None: both
    removed (the flags of one's own, as a TPU or GPU process and the plan cache's key take them;
    neither changes a compiled program)."""
    drop = (DEVICE_COUNT_FLAG,) if n is not None else (DEVICE_COUNT_FLAG, CPU_COLLECTIVE_TIMEOUT_FLAG)
    kept = [f for f in (xla_flags or "").split() if _flag_name(f) not in drop]
    if n is not None:
        kept.append(f"{DEVICE_COUNT_FLAG}={int(n)}")
        if not any(_flag_name(f) == CPU_COLLECTIVE_TIMEOUT_FLAG for f in kept):
            kept.append(f"{CPU_COLLECTIVE_TIMEOUT_FLAG}={CPU_COLLECTIVE_TIMEOUT_S}")
    return " ".join(kept)


TPU_GENERATIONS = ("v4", "v5e", "v5p", "v6e")  # the TPU entries of trainer/hardware.py


@dataclass(frozen=True)
class FlagSet:
    xla_flags: tuple[str, ...]  # added to XLA_FLAGS (every platform)
    libtpu_init_args: tuple[str, ...]  # added to LIBTPU_INIT_ARGS (platform "tpu" only)
    description: str
    source: str
    generations: tuple[str, ...] = field(kw_only=True)  # the TPU chips it applies to (CPU, GPU: every set)
    # (generation, the compiler's line) for each generation whose compiler refuses the set
    refusals: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)

    def __post_init__(self):
        unknown = [g for g in self.generations + tuple(g for g, _ in self.refusals) if g not in TPU_GENERATIONS]
        if not self.generations or unknown:
            raise ValueError(f"a FlagSet names one or more TPU generations of {TPU_GENERATIONS}, got "
                             f"generations={self.generations} refusals={[g for g, _ in self.refusals]}")

    def as_dict(self) -> dict:
        return {"XLA_FLAGS": list(self.xla_flags), "LIBTPU_INIT_ARGS": list(self.libtpu_init_args)}


# MaxText's flag groups (benchmarks/xla_flags_library.py @_MX_FLAGS), as the v6e sets use them
_MX_FLAGS = "48445cf00e73064e87886539714a8ba1794ee019"
_MX_V6E = "bfd388fd4eb0e8ee3f07955dc3b3edb14e9fb163"  # benchmarks/maxtext_trillium_model_configs.py
_NO_COLLECTIVE_MATMUL = ("--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000",)  # DISABLE_COLLECTIVE_MATMUL
_VMEM = ("--xla_tpu_scoped_vmem_limit_kib=98304",)  # DENSE_VMEM_LIMIT_FLAG
_LAYOUT_RS = ("--xla_tpu_use_minor_sharding_for_major_trivial_input=true",  # LAYOUT_FOR_ALL_REDUCE_SCATTER
              "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1",
              "--xla_tpu_assign_all_reduce_scatter_layout=true")
_DP_OVERLAP = ("--xla_tpu_enable_data_parallel_all_reduce_opt=true",  # DATA_PARALLEL_OVERLAP
               "--xla_tpu_data_parallel_opt_different_sized_ops=true")
_CF_WITHOUT_AG_FUSION = ("--xla_tpu_enable_async_collective_fusion=true",  # CF_FOR_ALL_GATHER less ..._fuse_all_gather
                         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
                         "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true")
_SC_ALL_REDUCE = ("--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false",  # ENABLE_SPARSECORE_OFFLOADING_
                  "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true",  # FOR_ALL_REDUCE, its base
                  "--xla_tpu_enable_all_reduce_offload_tracing=true",  # flags less --2a886c8_chip_config_name
                  "--xla_tpu_use_tc_device_shape_on_sc=true", "--xla_sc_enable_instruction_fusion=false",
                  "--xla_sc_disjoint_spmem=false", "--xla_sc_disable_megacore_partitioning=true")
_HOST_OFFLOAD = ("--xla_tpu_enable_all_experimental_scheduler_features=true",  # HOST_OFFLOAD_FLAGS
                 "--xla_tpu_enable_scheduler_memory_pressure_tracking=true", "--xla_tpu_host_transfer_overlap_limit=24",
                 "--xla_tpu_aggressive_opt_barrier_removal=ENABLED",
                 "--xla_lhs_prioritize_async_depth_over_stall=ENABLED",
                 "--xla_tpu_enable_ag_backward_pipelining=true",
                 "--xla_should_allow_loop_variant_parameter_in_chain=ENABLED",
                 "--xla_should_add_loop_invariant_op_in_chain=ENABLED", "--xla_max_concurrent_host_send_recv=100",
                 "--xla_tpu_scheduler_percent_shared_memory_limit=100", "--xla_latency_hiding_scheduler_rerun=2")

# Paxml's multi-slice C4 runs (the seeds: paxml docs, "multislice" section) and MaxText's
# benchmarks/xla_flags_library.py (CF_FOR_ALL_GATHER, DATA_PARALLEL_OVERLAP) are the sources
# of the TPU sets; JAX's "GPU performance tips" page of the GPU one.
FLAG_SETS: dict[str, FlagSet] = {
    "default": FlagSet((), (), "no flags added: the compiler's defaults", "-", generations=TPU_GENERATIONS),
    "latency_hiding": FlagSet(
        ("--xla_gpu_enable_latency_hiding_scheduler=true",),
        ("--xla_tpu_enable_latency_hiding_scheduler=true", "--xla_enable_async_all_gather=true"),
        "latency-hiding scheduler and async all-gather: overlap collectives with compute (TPU, GPU)",
        "Paxml multi-slice LIBTPU_INIT_ARGS (seeds); JAX GPU performance tips", generations=TPU_GENERATIONS),
    "paxml_multislice": FlagSet(
        (),
        ("--xla_jf_spmd_threshold_for_windowed_einsum_mib=0", "--xla_tpu_spmd_threshold_for_allgather_cse=10000",
         "--xla_enable_async_all_gather=true", "--xla_tpu_enable_latency_hiding_scheduler=true"),
        "Paxml's multi-slice C4 runs: windowed einsums, all-gather CSE threshold, async all-gather, LHS (TPU)",
        "Paxml multi-slice launch commands (seeds: C4Spmd22BAdam2xv4_128)", generations=TPU_GENERATIONS),
    "collective_fusion": FlagSet(
        (),
        ("--xla_tpu_enable_async_collective_fusion=true",
         "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true", "--xla_tpu_overlap_compute_collective_tc=true",
         "--xla_enable_async_all_gather=true", "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
         "--xla_tpu_data_parallel_opt_different_sized_ops=true"),
        "continuation fusion of all-gathers and data-parallel all-reduce overlap (TPU)",
        "MaxText benchmarks/xla_flags_library.py: CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP", generations=("v5e",),
        refusals=tuple((g, f"FAILED_PRECONDITION: Continuation fusion for AllGather is enabled on platform {p} ... "
                           "not supported/recommended on platforms other than TPU v5e")
                       for g, p in (("v4", "pufferfish"), ("v5p", "viperfish"), ("v6e", "ghostlite")))),
    "v5p_collectives": FlagSet(
        (),
        ("--xla_tpu_megacore_fusion_allow_ags=false", "--xla_enable_async_collective_permute=true",
         "--xla_tpu_enable_ag_backward_pipelining=true", "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
         "--xla_tpu_data_parallel_opt_different_sized_ops=true", "--xla_tpu_enable_async_collective_fusion=true",
         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
         "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true"),
        "v5p: async collective-permutes (tensor-axis windowed einsums), all-gather backward pipelining, "
        "collective fusion without the all-gather continuation fusion the v5p compiler refuses (TPU)",
        "MaxText MaxText/configs/v5p/32b.sh and 64b.sh @76bd53b0 (2023-12-15) LIBTPU_INIT_ARGS",
        generations=TPU_GENERATIONS),
    # MaxText's v6e (Trillium) recipes, less the two flags this libtpu refuses there:
    # --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true (CF_FOR_ALL_GATHER: "platform
    # ghostlite", as collective_fusion) and --2a886c8_chip_config_name=megachip_tccontrol ("Unknown
    # command line flag"; search/planning/topology.py compiles v6e with chip_config_name megachip_tccontrol).
    "no_collective_matmul": FlagSet(
        (), _NO_COLLECTIVE_MATMUL,
        "collective matmul off: no windowed-einsum loops for tensor-axis matmuls (MaxText's DISABLE_COLLECTIVE_MATMUL, "
        "from its v6e recipes)",
        f"MaxText benchmarks/xla_flags_library.py @{_MX_FLAGS} DISABLE_COLLECTIVE_MATMUL, used by "
        f"benchmarks/maxtext_trillium_model_configs.py @{_MX_V6E} llama3_1_8b_8192_no_collective_matmul and "
        "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul",
        generations=TPU_GENERATIONS),
    "v6e_sparsecore": FlagSet(
        (), _VMEM + _CF_WITHOUT_AG_FUSION + _SC_ALL_REDUCE,
        "v6e: all-reduces offloaded to the SparseCores, collective fusion without the all-gather continuation "
        "fusion, the dense scoped-VMEM limit (MaxText's Llama2-70B SparseCore recipe)",
        f"MaxText benchmarks/maxtext_trillium_model_configs.py @{_MX_V6E} llama2_70b_4096_sc: DENSE_VMEM_LIMIT_FLAG "
        f"+ CF_FOR_ALL_GATHER + ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE (xla_flags_library.py @{_MX_FLAGS})",
        generations=TPU_GENERATIONS),
    "v6e_llama3": FlagSet(
        (), _VMEM + _LAYOUT_RS + _DP_OVERLAP + _CF_WITHOUT_AG_FUSION + _SC_ALL_REDUCE + _HOST_OFFLOAD,
        "v6e: MaxText's Llama 3.1 recipe: reduce-scatter layouts, data-parallel overlap, SparseCore all-reduce, "
        "host-offload scheduling, collective fusion without the all-gather continuation fusion",
        f"MaxText benchmarks/maxtext_trillium_model_configs.py @{_MX_V6E} llama3_1_8b_8192: DENSE_VMEM_LIMIT_FLAG + "
        "LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP + CF_FOR_ALL_GATHER + "
        f"ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE + HOST_OFFLOAD_FLAGS (xla_flags_library.py @{_MX_FLAGS})",
        generations=TPU_GENERATIONS),
    "v6e_llama3_no_collective_matmul": FlagSet(
        (), _VMEM + _LAYOUT_RS + _DP_OVERLAP + _CF_WITHOUT_AG_FUSION + _SC_ALL_REDUCE + _HOST_OFFLOAD
        + _NO_COLLECTIVE_MATMUL,
        "v6e_llama3 with collective matmul off (MaxText's DISABLE_COLLECTIVE_MATMUL)",
        f"MaxText benchmarks/maxtext_trillium_model_configs.py @{_MX_V6E} llama3_1_8b_8192_no_collective_matmul: "
        "v6e_llama3's groups + DISABLE_COLLECTIVE_MATMUL",
        generations=TPU_GENERATIONS),
    # libtpu 0.0.52 (the copies began in 0.0.51) with the layer input and the attention output both offloaded to host
    # (remat custom: decoder_input and out_proj = offload): the collective pipeliner makes the
    # compiler copy both whole [layers, rows, seq, d_model] stacks from host memory to HBM
    # between the forward and the backward, relay them out there and copy them back (17 GB each
    # way a step on the v6e-256 Llama3.1-8B recipe; none under libtpu <= 0.0.50). Without it, none.
    "no_collective_pipeliner": FlagSet(
        (), ("--xla_tpu_enable_collective_pipeliner=false",),
        "collective pipeliner off: on libtpu 0.0.52 it is what makes a step with both the layer input "
        "and the attention output offloaded copy the two whole stacks from host to HBM and back for a relayout; "
        "compose it with another set as SET+no_collective_pipeliner",
        "measured here: the v6e-256 Llama3.1-8B recipe's step through the HLO passes (libtpu 0.0.52) has 4 "
        "whole-stack bf16[32,4,8192,4096] host copies with v6e_llama3, none with v6e_llama3+no_collective_pipeliner "
        "(benchmarks/RESULTS.md, 'The collective pipeliner and the offloaded stacks')",
        generations=TPU_GENERATIONS),
    "cpu_eigen_dots": FlagSet(
        ("--xla_cpu_experimental_ynn_fusion_type=",),
        (),
        "CPU: matmuls through XLA's own (Eigen) dot emitter instead of YNNPACK library fusions",
        "XLA debug_options_flags.cc (xla_cpu_experimental_ynn_fusion_type; empty = no library fusion)",
        generations=TPU_GENERATIONS),
}


COMPOSE = "+"  # "v6e_llama3+no_collective_pipeliner": the sets' flags together, the later's winning a clash


def names() -> list[str]:
    return list(FLAG_SETS)


def check(name) -> FlagSet:
    """The set called `name`, or the sets `a+b+...` composed (their flags in that order, a flag
    of the same name taking the later set's value; the TPU generations all of them apply to);
    ConfigError (one line, listing the sets) for an unknown name or part."""
    parts = name.split(COMPOSE) if isinstance(name, str) else [name]
    unknown = [p for p in parts if not isinstance(p, str) or p not in FLAG_SETS]
    if unknown:
        what = repr(name) if len(parts) == 1 else f"{unknown[0]!r} (in {name!r})"
        raise ConfigError(f"unknown compiler flag set {what}; choose one of {', '.join(FLAG_SETS)}, or "
                          f"several joined by '{COMPOSE}' (trainer/flagsets.py)")
    if len(parts) == 1:
        return FLAG_SETS[name]
    if len(set(parts)) < len(parts) or "default" in parts:
        raise ConfigError(f"compiler flag set {name!r} names a set twice or names 'default'; join distinct sets "
                          f"other than 'default' with '{COMPOSE}'")
    sets = [FLAG_SETS[p] for p in parts]
    generations = tuple(g for g in TPU_GENERATIONS if all(g in s.generations for s in sets))
    if not generations:
        raise ConfigError(f"compiler flag set {name!r}: no TPU generation takes all of {', '.join(parts)}")
    xla, libtpu = "", ""
    for s in sets:
        xla, libtpu = _merge(xla, s.xla_flags), _merge(libtpu, s.libtpu_init_args)
    refusals = tuple(dict(r for s in sets for r in s.refusals if r[0] not in generations).items())
    return FlagSet(tuple(xla.split()), tuple(libtpu.split()), " + ".join(s.description for s in sets),
                   " + ".join(s.source for s in sets), generations=generations, refusals=refusals)


def known(name) -> bool:
    """Whether `name` is a set of the table, or sets of it composed (check would return one)."""
    try:
        check(name)
    except ConfigError:
        return False
    return True


def for_generation(chip: str) -> list[str]:
    """The sets that apply to TPU generation `chip` ("v6e"), in table order."""
    return [n for n, s in FLAG_SETS.items() if chip in s.generations]


def applies(name: str, platform: str | None, chip: str | None = None) -> bool:
    """True when set `name` may be used on `platform` with TPU generation `chip`: every set on
    CPU and GPU, and on a TPU whose generation is unknown (None)."""
    return platform != "tpu" or chip is None or chip in check(name).generations


def check_target(name, platform: str | None, chip: str | None = None) -> FlagSet:
    """The set called `name` when it applies to `platform` / TPU generation `chip`; ConfigError
    (one line naming the set, the generation and the sets that apply) when not, or when there is
    no such set. No compile: the table records what the compiler refuses."""
    s = check(name)
    if applies(name, platform, chip):
        return s
    assert chip is not None
    said = dict(s.refusals).get(chip)
    why = f" (libtpu's {chip} compiler: {said})" if said else ""
    raise ConfigError(f"compiler flag set {name!r} does not apply to TPU {chip}{why}; it applies to "
                      f"{', '.join(s.generations)}; sets for {chip}: {', '.join(for_generation(chip))} "
                      "(trainer/flagsets.py)")


def describe(name: str) -> str:
    s = check(name)
    flags = " ".join(s.xla_flags + s.libtpu_init_args) or "no flags"
    return f"{name}: {s.description} [{flags}] (TPU: {', '.join(s.generations)}; source: {s.source})"


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


def own_flags(environ=None) -> str:
    """The XLA_FLAGS of `environ` (default os.environ) that are the user's own: without the
    simulated device count and the collective timeout paxsearch sets itself."""
    env = os.environ if environ is None else environ
    return with_device_count(env.get("XLA_FLAGS"), None)


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


START_BACKEND = "import jax; jax.devices()"  # what a probe runs unless its caller gives other code


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


def validate(name: str, platform: str, base_env=None, probe: str | None = None,
             compile_only: bool = False) -> None:
    """Start a throw-away process with the set applied and its backend started; ConfigError
    (one line) when XLA or libtpu refuses a flag. Each (set, platform, flags) is probed once
    per process. probe: the Python code that process runs instead of START_BACKEND, on the CPU
    backend: for a compile-only TPU target (plan mode), the planner's, which loads its topology
    and compiles one op (search/planning/topology.py flag_probe: libtpu reads LIBTPU_INIT_ARGS
    when it loads, and its own XLA reads XLA_FLAGS when it first compiles). compile_only: a
    plan-only target (no such device here): the flags are probed on the CPU backend, which
    parses the same XLA flags (a GPU node planned without GPUs)."""
    check(name)
    base = dict(os.environ if base_env is None else base_env)
    env = {**base, **env_for(name, platform, base)}
    if platform == "cpu" or probe or compile_only:  # compile-only devices need no TPU/GPU backend
        env["JAX_PLATFORMS"] = "cpu"
    key = (name, platform, probe, compile_only, env.get("XLA_FLAGS"), env.get("LIBTPU_INIT_ARGS"))
    if key in _VALID:
        return
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        proc = subprocess.run([sys.executable, "-c", probe or START_BACKEND], env=env, capture_output=True,
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
