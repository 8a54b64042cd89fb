"""What plan() and train() return, and what train() reports at each logging interval."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device bytes from XLA's compiled memory analysis."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        # Donated inputs alias outputs: count them once.
        return (self.argument_bytes + self.output_bytes - self.alias_bytes
                + self.temp_bytes + self.generated_code_bytes)


# How PlanResult.xla_flops_per_step was counted (also the prediction's "flops_source")
FLOPS_FROM_HLO = "optimized HLO, loop trip counts applied"  # plan.build_program's hlo_flops reader
FLOPS_FROM_PROBES = "XLA cost_analysis of unrolled 1- and 2-layer probes"  # two more compiles
FLOPS_LOOP_BODY_ONCE = "XLA cost_analysis (loop body once)"  # not loop-corrected (count_flops=False)
FLOPS_NO_LOOPS = "XLA cost_analysis (a step without loops)"  # exact as it stands


@dataclass(frozen=True)
class PlanResult:
    """Ahead-of-time figures for one train step of a config on a set of devices."""

    memory: MemoryEstimate
    peak_bytes: int  # memory.peak_bytes, per device
    xla_flops_per_step: float  # per device, loop trip counts corrected where flops_source says so
    xla_bytes_accessed_per_step: float  # per device, likewise
    model_flops_per_step: int  # analytic, whole step over all devices (see flops.py)
    param_count: int
    global_batch: int
    tokens_per_step: int
    num_devices: int
    device_kind: str
    platform: str
    compile_seconds: float
    mesh_shape: dict[str, int] = field(default_factory=dict)
    hlo_text: str | None = None  # optimized HLO (kept only when asked)
    hlo_source: str | None = None  # where hlo_text came from: "as_text" | "hlo_modules" | "xla_dump"
    hlo_error: str | None = None  # why there is no hlo_text although it was asked for
    # share of the pipeline's stage-iterations that compute nothing useful (trainer/pipeline.py
    # bubble_fraction; 0 without a stage axis); it lowers MFU, model FLOPs never count it
    pipeline_bubble: float = 0.0
    # seconds of each phase of build_program: lower_s (trace and lower to StableHLO), compile_s
    # (XLA: SPMD partitioning and the backend), flop_probes_s (counting the loop-corrected FLOPs:
    # from the optimized HLO, or the unrolled probes where it cannot be read; 0 without count_flops),
    # hlo_text_s (the optimized module as text)
    phases: dict[str, float] = field(default_factory=dict)
    flops_source: str = FLOPS_LOOP_BODY_ONCE  # one of the FLOPS_* above

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("hlo_text", None)
        return d


@dataclass(frozen=True)
class StepMetrics:
    """Metrics at one logging interval (process 0's view; identical on all processes)."""

    step: int
    loss: float
    log_pplx: float
    learning_rate: float
    grad_norm: float
    param_norm: float
    step_time: float  # seconds per step, averaged over the interval (post warm-up)
    steps_per_sec: float
    tokens_per_sec: float
    model_tflops_per_device: float
    mfu: float
    hfu: float
    compiled_peak_bytes: int
    measured_peak_bytes: int  # 0: not measured (distributed.PeakMeter: an earlier run of the process set the marks)
    eval_loss: float | None = None
    # seconds the loop was blocked in checkpoint saves during the interval (waiting for the
    # previous write, copying the state off the devices); not in step_time, tokens/s, MFU
    checkpoint_s: float = 0.0
    # a mixture-of-experts model's (trainer/moe.py) load-balancing loss (averaged over its MoE layers,
    # before its weight) and the share of routes dropped over capacity; None for a dense model
    load_balance_loss: float | None = None
    dropped_fraction: float | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("load_balance_loss", "dropped_fraction"):  # a dense model's metrics as before MoE existed
            if d[name] is None:
                del d[name]
        return d


@dataclass(frozen=True)
class CheckpointSeconds:
    """Where a run's checkpoint saves spent the training loop's time (trainer/checkpoint.py).

    A save blocks the loop only while it waits for the previous save's write to finish and while
    Orbax copies the state off the devices (before the next step is given the state's buffers);
    serializing and writing run in Orbax's background thread. None of it is in step time."""

    saves: int = 0
    blocking_s: float = 0.0  # the loop blocked in saves, all of them (the final save's included)
    waiting_for_previous_s: float = 0.0  # of blocking_s: a save waiting for the previous save's write
    final_wait_s: float = 0.0  # at the end: waiting for the last save's write to finish

    @property
    def blocking_per_save_s(self) -> float:
        return self.blocking_s / self.saves if self.saves else 0.0


@dataclass(frozen=True)
class TrainResult:
    plan: PlanResult
    history: list[StepMetrics]
    final: StepMetrics | None
    steps_run: int
    stopped_early: bool
    eval_loss: float | None
    run_dir: str | None
    start_step: int = 0  # > 0 when resumed from a checkpoint
    checkpoint_seconds: CheckpointSeconds | None = None  # None: a run without checkpoints
