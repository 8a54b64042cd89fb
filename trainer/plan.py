"""Ahead-of-time compilation of the train step: memory and FLOPs without allocating arrays.

`build_program` lowers and compiles the sharded step from ShapeDtypeStructs; train() reuses
the same compiled executable, so a trial never compiles its step twice.

The executed FLOPs (HFU's numerator) are counted by the trainer itself with XLA's cost analysis
and, where the step has loops, two unrolled probes; a caller that can read the optimized module
(the planner: search/planning/predict.py hlo_cost) passes its reader as `hlo_flops` and the
probes are not compiled. Nothing here imports the planner.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import attention as attention_lib
from . import flops as flops_lib
from . import hardware, sharding, validate
from . import mesh as mesh_lib
from . import moe as moe_lib
from . import pipeline as pipeline_lib
from . import placement as placement_lib
from . import step as step_lib
from .compile_cache import no_persistent_cache_writes
from .config import TrainConfig
from .results import FLOPS_FROM_HLO, FLOPS_FROM_PROBES, FLOPS_LOOP_BODY_ONCE, FLOPS_NO_LOOPS, MemoryEstimate, PlanResult

BATCH_KEYS_INT = ("inputs", "targets", "segment_ids", "positions")
# A reader of executed cost: (FLOPs, HBM bytes) per device of one step from its optimized module's
# text, every loop's trip count applied; None where it cannot read them (the probes count instead).
HloFlops = Callable[[str], tuple[float, float] | None]


@dataclass
class Program:
    """Everything needed to run the compiled step of one config on one mesh."""

    cfg: TrainConfig
    mesh: Any
    model: Any
    tx: Any
    schedule: Any
    state_shardings: Any
    batch_sharding: NamedSharding
    abstract_state: Any
    abstract_batch: dict
    compiled_step: Any
    plan: PlanResult
    rules: tuple = sharding.LOGICAL_RULES  # the resolved logical-axis rules table (sharding.rules_for)
    # the state's shardings in device memory when some of it is offloaded to host between steps
    device_shardings: Any = None

    def params_on_device(self, params):
        """`params` in device memory (a copy when they are offloaded, else themselves)."""
        if self.device_shardings is None:
            return params
        return jax.device_put(params, self.device_shardings["params"])

    def init_state(self, rng):
        # Initialization does not depend on the remat policy, the batch or the learning rate:
        # tracing it without them lets the persistent compilation cache serve every trial
        # that shares a model and a mesh.
        cfg = dataclasses.replace(self.cfg, remat="none", per_device_batch=None, global_batch=1,
                                  optimizer=type(self.cfg.optimizer)(), steps=1)
        model, tx = self.model.clone(remat="none"), step_lib.make_optimizer(cfg.optimizer, cfg.steps)
        with self.context():
            fn = jax.jit(lambda r: step_lib.unbox(step_lib.init_state(cfg, model, tx, r)),
                         out_shardings=self.state_shardings)
            return fn(rng)

    def context(self):
        return mesh_context(self.mesh, self.rules)


@contextlib.contextmanager
def mesh_context(mesh, rules=sharding.LOGICAL_RULES):
    # jax.set_mesh (not the legacy `with mesh:`) sets the abstract mesh that Flax's logical
    # constraints look for; without it nn.with_logical_constraint is silently a no-op.
    with jax.set_mesh(mesh), sharding.with_rules(rules):
        yield


def resolved_rules(cfg: TrainConfig, mesh) -> tuple:
    """cfg.mesh.rules resolved for this model and mesh (sharding.rules_for)."""
    return sharding.rules_for(cfg.mesh.rules, cfg.model, dict(mesh.shape))


def make_model(cfg: TrainConfig, platform: str, stages: int = 1, context: int = 1, head_over_stage: bool = False):
    """The model with cfg.model.attention resolved for `platform` (attention.implementation),
    on CPU the MLP-gradient fusion barrier (model.grads_behind_barrier), with `stages`
    > 1 (the mesh's stage axis) the layers pipelined as cfg.pipeline says (and with
    `head_over_stage` what follows them split over the stage devices too), and with `context` > 1
    (the mesh's context axis) the sequence split over it (trainer/context.py)."""
    model = step_lib.make_model(cfg).clone(attention_impl=attention_lib.implementation(cfg.model, platform),
                                           mlp_grad_barrier=platform == "cpu", context_shards=context,
                                           moe_grouped_matmul=moe_lib.grouped_matmul(cfg.model, platform))
    if stages > 1:
        model = model.clone(pipeline_stages=stages, pipeline_microbatches=cfg.pipeline.microbatches,
                            pipeline_repeats=cfg.pipeline.repeats,
                            head_batch="stage_batch" if head_over_stage else "batch")
    return model


def _abstract(shape_tree, sharding_tree):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shape_tree, sharding_tree)


def abstract_batch(cfg: TrainConfig, global_batch: int, batch_sh) -> dict:
    shape = (global_batch, cfg.model.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh) for k in BATCH_KEYS_INT}
    batch["weights"] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sh)
    return batch


def _cost(compiled) -> tuple[float, float]:
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = ca or {}
    return float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0))


def memory_estimate(compiled) -> MemoryEstimate:
    ma = compiled.memory_analysis()
    return MemoryEstimate(
        argument_bytes=int(ma.argument_size_in_bytes), output_bytes=int(ma.output_size_in_bytes),
        temp_bytes=int(ma.temp_size_in_bytes), alias_bytes=int(ma.alias_size_in_bytes),
        generated_code_bytes=int(getattr(ma, "generated_code_size_in_bytes", 0) or 0),
        host_temp_bytes=int(getattr(ma, "host_temp_size_in_bytes", 0) or 0))


def _lower_and_compile(cfg: TrainConfig, mesh, global_batch: int, rules, platform: str, unroll: bool = False,
                       phases: dict[str, float] | None = None, compiler_options: dict | None = None):
    """Lower and compile the train step; `phases` (when given) gets lower_s and compile_s."""
    phases = {} if phases is None else phases
    *lowering, lowered = lower_step(cfg, mesh, global_batch, rules, platform, unroll, phases)
    t1 = time.perf_counter()
    with mesh_context(mesh, rules):
        compiled = lowered.compile(compiler_options=compiler_options)
    phases["compile_s"] = time.perf_counter() - t1
    return (*lowering, lowered, compiled)


def lower_step(cfg: TrainConfig, mesh, global_batch: int, rules, platform: str, unroll: bool = False,
               phases: dict[str, float] | None = None, lower: bool = True):
    """(model, tx, schedule, placement, batch sharding, abstract state, abstract batch, lowered step);
    `phases` (when given) gets lower_s. With lower=False the step is traced for its shapes and
    shardings only and the lowered step is None (search/planning/hlo_passes.py: its child lowers it)."""
    phases = {} if phases is None else phases
    t0 = time.perf_counter()
    # pipelined over the stage axis only with stacked layers: the FLOP probes (scan_layers=False)
    # compile the same layers unpipelined (_pipeline_corrected_cost)
    sizes = dict(mesh.shape)
    stages = sizes.get("stage", 1) if cfg.model.scan_layers else 1
    rows = global_batch // max(cfg.grad_accum_steps, 1)  # the rows one forward pass holds
    head_over_stage = rows % (sizes.get("data", 1) * sizes.get("stage", 1) * sizes.get("fsdp", 1)) == 0
    model = make_model(cfg, platform, stages, sizes.get("context", 1), head_over_stage)
    schedule = step_lib.learning_rate_schedule(cfg.optimizer, cfg.steps)
    tx = step_lib.make_optimizer(cfg.optimizer, cfg.steps)
    with mesh_context(mesh, rules):
        # the key is made inside the trace: under jax.set_mesh an eager op would run on the
        # mesh's devices, which for a TPU topology compiled on a CPU machine cannot execute
        boxed = jax.eval_shape(lambda: step_lib.init_state(cfg, model, tx, jax.random.key(0)))
        state_shardings = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
        placement = placement_lib.place(cfg, state_shardings, step_lib.unbox(boxed))
        state_shardings = placement.stored
        abstract_state = _abstract(step_lib.unbox(boxed), state_shardings)
        batch_sh = sharding.batch_sharding(mesh)
        batch = abstract_batch(cfg, global_batch, batch_sh)
        metric_sh = NamedSharding(mesh, P())
        step_fn = jax.jit(step_lib.make_train_step(model, tx, schedule, cfg.grad_accum_steps, unroll,
                                                   placement.device, placement.grads),
                          in_shardings=(state_shardings, batch_sh),
                          out_shardings=(state_shardings, metric_sh), donate_argnums=(0,))
        lowered = step_fn.lower(abstract_state, batch) if lower else None
    phases["lower_s"] = time.perf_counter() - t0
    return model, tx, schedule, placement, batch_sh, abstract_state, batch, lowered


def tpu_generation(devices: Sequence) -> str | None:
    """The TPU generation ("v6e") of `devices` (compile-only ones too): the hardware table's entry
    of their device kind; None off TPU or when unknown."""
    if not devices or devices[0].platform != "tpu":
        return None
    entry = hardware.find_device_kind(getattr(devices[0], "device_kind", ""))
    return entry.name if entry is not None and entry.platform == "tpu" else None


def setup(cfg: TrainConfig, devices: Sequence | None = None):
    """(devices, platform, global batch, mesh, logical rules) of `cfg` on `devices` (default: all
    devices), after the static checks (trainer.validate; ConfigError before anything compiles)."""
    devices = list(devices if devices is not None else jax.devices())
    process_count = len({getattr(d, "process_index", 0) for d in devices})
    platform = devices[0].platform
    validate.check(cfg, len(devices), platform, process_count, tpu_generation(devices))
    global_batch = mesh_lib.global_batch_size(cfg, len(devices))
    attention_lib.implementation(cfg.model, platform)  # a ConfigError before compiling
    mesh = mesh_lib.build_mesh(cfg.mesh, devices)
    return devices, platform, global_batch, mesh, resolved_rules(cfg, mesh)


def build_program(cfg: TrainConfig, devices: Sequence | None = None, *, count_flops: bool = True,
                  keep_hlo: bool = False, hlo_flops: HloFlops | None = None) -> Program:
    """Check, lower and compile the train step of `cfg` on `devices` (default: all devices).
    count_flops: count the executed FLOPs with every loop's trip count (_counted_cost), read from
    the optimized module by `hlo_flops` when given, else compiled as unrolled probes."""
    devices, platform, global_batch, mesh, rules = setup(cfg, devices)
    phases: dict[str, float] = {}
    # For a plan on compile-only devices (a TPU topology on this CPU), compiled.as_text() can fail
    # where the compile did not (optimized_hlo): the one compile then also dumps its optimized module,
    # so the text never costs a second compile (no persistent cache entry is lost: such a compile's
    # entry cannot be loaded without a client anyway).
    with _hlo_dump_folder(keep_hlo and compile_only(devices)) as dump_folder:
        model, tx, schedule, placement, batch_sh, abstract_state, batch, lowered, compiled = _lower_and_compile(
            cfg, mesh, global_batch, rules, platform, phases=phases, compiler_options=dump_options(dump_folder))
        memory = memory_estimate(compiled)
        t2 = time.perf_counter()
        hlo_text, hlo_source, hlo_error = (optimized_hlo(compiled, lowered, dump_folder) if keep_hlo
                                           else (None, None, None))
        phases["hlo_text_s"] = time.perf_counter() - t2
        stages = dict(mesh.shape).get("stage", 1)
        once = _cost(compiled)
        t1 = time.perf_counter()
        xla_flops, xla_bytes, flops_source = _counted_cost(
            cfg, compiled, once, hlo_text if keep_hlo else None, count_flops, stages, hlo_flops,
            probes=lambda probe: _cost(_lower_and_compile(probe, mesh, global_batch, rules, platform, unroll=True)[-1]))
        phases["flop_probes_s"] = time.perf_counter() - t1
    del lowered
    plan = plan_result(cfg, devices, mesh, global_batch, abstract_state, memory, phases,
                       hlo_text=hlo_text, hlo_source=hlo_source, hlo_error=hlo_error,
                       xla_flops=xla_flops, xla_bytes=xla_bytes, flops_source=flops_source)
    return Program(cfg, mesh, model, tx, schedule, placement.stored, batch_sh, abstract_state, batch, compiled, plan,
                   rules, placement.device)


def plan_result(cfg: TrainConfig, devices: Sequence, mesh, global_batch: int, abstract_state,
                memory: MemoryEstimate, phases: dict[str, float], *, hlo_text: str | None,
                hlo_source: str | None, hlo_error: str | None, xla_flops: float, xla_bytes: float,
                flops_source: str) -> PlanResult:
    """The PlanResult of a compiled (or, search/planning/hlo_passes.py, HLO-passes-only) step."""
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_state["params"]))
    stages = dict(mesh.shape).get("stage", 1)
    return PlanResult(
        memory=memory, peak_bytes=memory.peak_bytes, xla_flops_per_step=xla_flops,
        xla_bytes_accessed_per_step=xla_bytes,
        model_flops_per_step=flops_lib.model_flops_per_step(cfg.model, global_batch),
        param_count=int(n_params), global_batch=global_batch,
        tokens_per_step=global_batch * cfg.model.seq_len, num_devices=len(devices),
        device_kind=devices[0].device_kind, platform=devices[0].platform,
        compile_seconds=phases["lower_s"] + phases["compile_s"],
        mesh_shape=mesh_lib.named_sizes(mesh), hlo_text=hlo_text, hlo_source=hlo_source, hlo_error=hlo_error,
        pipeline_bubble=pipeline_lib.bubble_fraction(stages, cfg.pipeline.microbatches, cfg.pipeline.repeats),
        phases={k: round(v, 3) for k, v in phases.items()}, flops_source=flops_source)


def compile_only(devices: Sequence) -> bool:
    """Devices of a topology description (jax.experimental.topologies): programs compile for them,
    nothing runs."""
    return type(getattr(devices[0], "client", None)).__name__ == "CompileOnlyPyClient"


def optimized_hlo(compiled, lowered, dump_folder: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(optimized HLO text, where it came from, why there is none) of a compiled step.

    compiled.as_text() first. It rebuilds the module from its proto, which can fail where the
    compile did not (jax 0.10.2 / libtpu 0.0.52, v5p: "async-update instruction should have 1
    operands but sees 3" for a SparseCore gather offload), and so does the executable's
    hlo_modules(). Then the module XLA itself printed: the *.after_optimizations.txt in
    `dump_folder`, where `compiled` was compiled with an XLA dump to it (build_program does so
    for compile-only devices), else `lowered` compiled again with a dump into a temporary folder. Sources:
    "as_text", "hlo_modules", "xla_dump"; (None, None, reasons) when none gives a module. The
    memory figure never depends on this: it is memory_analysis() of the first compile."""
    errors = []
    try:
        text = compiled.as_text()  # None where the backend has no text view
        if text:
            return text, "as_text", None
        errors.append("as_text: no text view on this backend")
    except (jax.errors.JaxRuntimeError, NotImplementedError) as e:
        errors.append(f"as_text: {first_line(e)}")
    try:
        executable = compiled.runtime_executable()
        modules = executable.hlo_modules() if executable is not None else []
        if modules:
            return "\n\n".join(m.to_string() for m in modules), "hlo_modules", None
        errors.append("hlo_modules: none")
    except (jax.errors.JaxRuntimeError, NotImplementedError, AttributeError) as e:
        errors.append(f"hlo_modules: {first_line(e)}")
    try:
        return (_read_dump(dump_folder) if dump_folder else _dumped_hlo(lowered)), "xla_dump", None
    except (jax.errors.JaxRuntimeError, OSError, LookupError) as e:
        errors.append(f"xla_dump: {first_line(e)}")
    return None, None, "no optimized HLO: " + "; ".join(errors)


# TPU: <module>.after_optimizations.txt, CPU: <module>.cpu_after_optimizations.txt
DUMP_SUFFIX = "after_optimizations.txt"
# TPU: the same module after code generation, each op with the compiler's cycle estimate
# (roofline cost.compiler_cycles); read first where the compile got that far
CODEGEN_SUFFIX = "after_codegen.txt"


def _dumped_hlo(lowered) -> str:
    """Compile `lowered` again with XLA dumping its optimized module as text; that text.
    jax's persistent-cache key leaves XLA's dump options out (jax/_src/cache_key.py), so where
    the same program is in that cache and can be loaded, the cache serves it, nothing is dumped,
    and _read_dump says so (LookupError: the caller records why there is no HLO). A program of
    compile-only devices cannot be loaded from the cache, so it always compiles here."""
    with _hlo_dump_folder(True) as folder:
        lowered.compile(compiler_options=dump_options(folder))
        return _read_dump(folder)


def dump_options(folder: str | None) -> dict | None:
    """Compiler options that make XLA print the optimized module as text into `folder` (None: none)."""
    return {"xla_dump_to": folder, "xla_dump_hlo_as_text": True} if folder else None


def _read_dump(folder: str) -> str:
    """The optimized module an XLA dump to `folder` printed: its biggest *after_codegen.txt (TPU,
    with the compiler's per-op cycle estimates), else its biggest *after_optimizations.txt."""
    names = os.listdir(folder)
    dumps = [f for f in names if f.endswith(CODEGEN_SUFFIX)] or [f for f in names if f.endswith(DUMP_SUFFIX)]
    if not dumps:
        raise LookupError(f"the XLA dump wrote no *{DUMP_SUFFIX}")
    biggest = max(dumps, key=lambda f: os.path.getsize(os.path.join(folder, f)))
    with open(os.path.join(folder, biggest)) as f:
        return f.read()


@contextlib.contextmanager
def _hlo_dump_folder(wanted: bool):
    """A temporary folder for an XLA dump (None when not `wanted`), with nothing written to the
    persistent compilation cache meanwhile: the dump is wanted for programs of compile-only
    devices, whose entries cannot be loaded without a client (a later read would only warn and
    compile again; tests/roofline/test_hlo_source_fallback.py saw that warning)."""
    if not wanted:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="paxsearch-hlo-") as folder, no_persistent_cache_writes():
        yield folder


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _has_step_loops(cfg: TrainConfig) -> bool:
    """Loops of the step besides the layers': gradient-accumulation microbatches, vocab tiles."""
    return cfg.grad_accum_steps > 1 or cfg.model.vocab_tiles > 1


def _counted_cost(cfg: TrainConfig, compiled, once: tuple[float, float], hlo_text: str | None, count_flops: bool,
                  stages: int, hlo_flops: HloFlops | None,
                  probes: Callable[[TrainConfig], tuple[float, float]]) -> tuple[float, float, str]:
    """(FLOPs, bytes accessed, how they were counted) per device of the compiled step.

    XLA's cost_analysis() (`once`) counts a loop body once: the layers' scan, gradient-accumulation
    microbatches, vocab tiles and pipeline iterations run many times. With count_flops and a reader
    `hlo_flops` (the planner's: the roofline's step_work), the executed FLOPs are read from the
    optimized HLO with every loop's trip count applied (the module this compile made, no further
    compile; the bytes are then the roofline's HBM bytes, as the prediction's). Without a reader,
    where no module text can be had or a loop's trip count cannot be read, two unrolled probes are
    compiled instead (`probes(cfg) -> (flops, bytes)`, _loop_corrected_cost). Both agree within 1%
    (tests/trainer/test_plan_phases.py); the probes cost two compiles, ~60% of a small step's
    build on CPU."""
    flops, bytes_ = once
    if not count_flops:
        return flops, bytes_, FLOPS_LOOP_BODY_ONCE
    read = _hlo_cost(compiled, hlo_text, hlo_flops) if hlo_flops is not None else None
    if read is not None:
        return read[0], read[1], FLOPS_FROM_HLO
    if not (cfg.model.scan_layers and cfg.model.n_layers > 1 or _has_step_loops(cfg) or stages > 1):
        return flops, bytes_, FLOPS_NO_LOOPS
    if stages > 1 and cfg.model.scan_layers:
        return (*_pipeline_corrected_cost(cfg, probes, stages), FLOPS_FROM_PROBES)
    return (*_loop_corrected_cost(cfg, probes), FLOPS_FROM_PROBES)


def _hlo_cost(compiled, hlo_text: str | None, hlo_flops: HloFlops) -> tuple[float, float] | None:
    """`hlo_flops` of the optimized module (`hlo_text`, else compiled.as_text()), or None where
    there is no text or the reader cannot count it."""
    if hlo_text is None:
        try:
            hlo_text = compiled.as_text()
        except (jax.errors.JaxRuntimeError, NotImplementedError):  # no text view: the caller compiles probes
            return None
    if not hlo_text:
        return None
    return hlo_flops(hlo_text)


def _loop_corrected_cost(cfg: TrainConfig, probes) -> tuple[float, float]:
    """Compile unrolled 1- and 2-layer probes of the same step (microbatch and vocab-tile loops
    unrolled too) and extrapolate: cost(L) = cost(1) + (L - 1) * (cost(2) - cost(1))."""
    costs = []
    for n in (1, 2):
        costs.append(probes(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=n,
                                                                                scan_layers=False))))
    (f1, b1), (f2, b2) = costs
    n = cfg.model.n_layers
    return f1 + (n - 1) * (f2 - f1), b1 + (n - 1) * (b2 - b1)


def _pipeline_corrected_cost(cfg: TrainConfig, probes, stages: int) -> tuple[float, float]:
    """Executed FLOPs (and bytes) of a pipelined step, bubble included: the unrolled probes of
    _loop_corrected_cost compile the layers unpipelined (every stage's devices running every
    layer on their batch rows), from which the cost of one layer c and of the rest are read;
    a device of the pipeline runs n_layers / (S x R) layers on a microbatch in each of the
    M x R + S - 1 iterations, i.e. n_layers x c x (M x R + S - 1) / (M x R x S)."""
    p, n = cfg.pipeline, cfg.model.n_layers
    f_all, b_all = _loop_corrected_cost(cfg, probes)
    f_one, b_one = probes(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1,
                                                                              scan_layers=False)))
    share = pipeline_lib.iterations(stages, p.microbatches, p.repeats) / (p.microbatches * p.repeats * stages)

    def scaled(total: float, first: float) -> float:
        per_layer = (total - first) / max(n - 1, 1)
        return first - per_layer + n * per_layer * share

    return scaled(f_all, f_one), scaled(b_all, b_one)


def plan(cfg: TrainConfig, devices: Sequence | None = None, *, count_flops: bool = True,
         keep_hlo: bool = False, hlo_flops: HloFlops | None = None) -> PlanResult:
    """Per-device memory, FLOPs, parameter count and compile time of one train step."""
    return build_program(cfg, devices, count_flops=count_flops, keep_hlo=keep_hlo, hlo_flops=hlo_flops).plan
