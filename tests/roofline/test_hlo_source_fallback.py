"""A planning trial never loses its memory figure to a reporting failure (trainer/plan.py
optimized_hlo, issue 11).

On v5p the TPU compiler offloads a gather over vocabulary-sharded logits to the SparseCores
as an async start/update/done, and compiled.as_text() of such a program raises "INTERNAL:
RET_CHECK ... async-update instruction should have 1 operands but sees 3" (jax/jaxlib 0.10.2,
libtpu 0.0.52): printing rebuilds the module from its proto, and that proto does not rebuild.
The executable's hlo_modules() fails the same way. The trainer's own step met it through the
loss's target-logit gather (MaxText's 32B config on v5p-128); since trainer/xent.py takes the
target's logit as a masked sum, the step has no such gather and prints. The fallback stays:
any program XLA cannot print keeps memory_analysis() of its compile and takes the optimized
module that XLA itself dumps (a plan on compile-only devices compiles with --xla_dump_to into
a temporary folder, so this costs no second compile: tests/trainer/test_plan_phases.py counts
the compiles). Here that is proved on the smallest program that still fails: the old loss,
a take_along_axis cross-entropy over [16, 2048, 32768] bfloat16 logits, compiled for v5p-128.
"""
import dataclasses
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from paxsearch.search.planning import targets as T
from paxsearch.search.planning import topology
from paxsearch.search.planning.compilation import plan_point
from paxsearch.search.planning.predict import hardware_for, predict
from paxsearch.search.planning.roofline.model import analyze
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig

from ..search_util import needs_libtpu

SMALL = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, seq_len=32)


def _gather_loss(logits_BSV, targets_BS):
    """The cross-entropy as the trainer took it before trainer/xent.py: the target's logit by a gather."""
    x = logits_BSV.astype(jnp.float32)
    target_BS = jnp.take_along_axis(x, targets_BS[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(x, axis=-1) - target_BS)


@needs_libtpu
@pytest.mark.slow
def test_a_v5p_program_that_cannot_print_gets_its_hlo_from_the_xla_dump():
    devices = topology.topology_devices("v5p-128")
    mesh = Mesh(np.array(devices).reshape(16, 4), ("fsdp", "tensor"))
    step = jax.jit(jax.value_and_grad(_gather_loss),
                   in_shardings=(NamedSharding(mesh, P("fsdp", None, "tensor")), NamedSharding(mesh, P("fsdp", None))))
    lowered = step.lower(jax.ShapeDtypeStruct((16, 2048, 32768), jnp.bfloat16),
                         jax.ShapeDtypeStruct((16, 2048), jnp.int32))
    # as a plan compiles for compile-only devices: nothing written to the persistent cache (an
    # executable of such devices cannot be read back; a later read would only warn and compile)
    with tempfile.TemporaryDirectory() as folder, topology.no_persistent_cache_writes():
        compiled = lowered.compile(compiler_options=plan_lib.dump_options(folder))
        # the bug is real for this program: printing it fails (a fixed jax fails here)
        with pytest.raises(jax.errors.JaxRuntimeError, match="async-update instruction should have 1 operands"):
            compiled.as_text()
        # ... yet memory_analysis() of the same compile stands
        assert plan_lib.memory_estimate(compiled).temp_bytes == compiled.memory_analysis().temp_size_in_bytes > 0
        # ... and the module comes from the dump of that one compile
        text, source, error = plan_lib.optimized_hlo(compiled, lowered, folder)
    assert source == "xla_dump" and error is None
    assert text.startswith("HloModule") and "is_scheduled=true" in text.splitlines()[0]
    assert "async-update" in text  # the instruction the proto could not rebuild
    # without a dump of its own, the fallback compiles once more with one
    again, source_again, _ = plan_lib.optimized_hlo(compiled, lowered)
    assert source_again == "xla_dump" and "async-update" in again
    # the roofline replays the dumped module: the logits' elementwise work and the collectives over tensor
    roofline = analyze(text, hardware_for(devices), mesh=mesh)
    assert roofline.step_time_s > 0 and roofline.flops_per_step >= 16 * 2048 * 32768 / 64
    # the dump read is the module after code generation: the compiler's per-op estimates with it
    assert '"estimated_cycles"' in text and roofline.compiler_cycles_ops > 0


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_as_text_is_the_source_where_it_works():
    program, plan = plan_point(TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=1),
                                         T.parse_target("cpu:8"))
    assert plan.hlo_source == program.plan.hlo_source == "as_text" and program.plan.hlo_error is None
    assert program.plan.hlo_text == program.compiled_step.as_text()
    assert plan.predicted_step_time > 0 and program.plan.to_dict()["hlo_source"] == "as_text"


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_the_xla_dump_gives_the_module_as_text_gives():
    cfg = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=1)
    devices = jax.devices()
    program = plan_lib.build_program(cfg, devices, count_flops=False)
    assert program.plan.hlo_text is None and program.plan.hlo_source is None  # not asked for
    mesh, rules = program.mesh, program.rules
    lowered = plan_lib._lower_and_compile(cfg, mesh, program.plan.global_batch, rules, "cpu")[-2]
    dumped = plan_lib._dumped_hlo(lowered)
    assert dumped.startswith("HloModule jit_train_step")
    # the same optimized module: the same computations, whatever the instruction numbering
    as_text = program.compiled_step.as_text()
    names = lambda text: sorted(line.split(" ")[0] for line in text.splitlines() if line.startswith("ENTRY"))
    assert names(dumped) == names(as_text) and abs(len(dumped) - len(as_text)) < 0.05 * len(as_text)


def test_without_any_hlo_the_plan_stands_and_the_roofline_says_why():
    cfg = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=1)
    devices = jax.devices()
    program = plan_lib.build_program(cfg, devices, count_flops=False, keep_hlo=False)
    reason = "no optimized HLO: as_text: JaxRuntimeError: INTERNAL: ...; hlo_modules: ...; xla_dump: ..."
    program.plan = dataclasses.replace(program.plan, hlo_error=reason)
    out = predict(program, hardware_for(devices))
    assert out.roofline == {"predicted": True, "error": f"roofline failed: {reason}"}
    assert out.step_time_s is None and out.mfu is None and out.hlo_source is None
    assert out.flops_source == "XLA cost_analysis (loop body once)" and out.flops_per_step > 0
    assert program.plan.peak_bytes > 0
