"""The training loop: compiled step, donated state, logging-interval syncs only; the next
batches are read and placed on the devices in a background thread (trainer/prefetch.py)."""
from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable

import jax

from . import distributed
from . import flops as flops_lib
from .config import TrainConfig
from .errors import ConfigError, NonFiniteLoss
from .plan import Program, build_program
from .prefetch import Prefetcher
from .results import StepMetrics, TrainResult
from .step import make_eval_step
from .tb import ScalarWriter

if TYPE_CHECKING:
    from . import data as data_lib

Report = Callable[[StepMetrics], object]
DIVERGENCE_FACTOR = 2.0  # loss above this multiple of the first step's loss counts as diverged
PREFETCH_DEPTH = 2  # batches read and placed on the devices ahead of the running step


def train(cfg: TrainConfig, report: Report | None = None, *, program: Program | None = None,
          resume: bool = True, prefetch: int = PREFETCH_DEPTH) -> TrainResult:
    """Train `cfg`; `report(metrics)` is called at each logging interval and stops the run
    when it returns a true value. Resumes from the latest checkpoint when there is one.
    `prefetch`: batches prepared and transferred ahead in a background thread (0: none)."""
    distributed.maybe_initialize(cfg.distributed)
    program = program or build_program(cfg)
    plan = program.plan
    pidx, pcount = jax.process_index(), jax.process_count()
    check_vocab(cfg)
    peak_meter = distributed.PeakMeter(jax.local_devices()[0])  # before the state is on the devices

    run_dir = cfg.run_dir
    writer = ScalarWriter(os.path.join(run_dir, "tb") if run_dir and cfg.log.tensorboard and pidx == 0 else None)
    ckpt = None
    if cfg.checkpoint.enabled:
        from .checkpoint import Checkpointer  # Orbax, imported only by a run that checkpoints (not trials)

        ckpt = Checkpointer(cfg.checkpoint, run_dir)
    start = 0
    try:
        if ckpt and resume and ckpt.latest_step() is not None:
            state, start = ckpt.restore_latest(program.abstract_state)  # the newest readable step
        else:
            state = program.init_state(jax.random.key(cfg.seed))
    except BaseException:
        # Close Orbax's manager (its asyncio threads) and the event file before the error leaves:
        # left open, they print "Event loop is closed" tracebacks at interpreter exit under the
        # one-line error a refused resume gives.
        if ckpt:
            ckpt.close()
        writer.close()
        raise

    local_devices = jax.local_device_count()
    peak, _ = flops_lib.peak_flops_per_device(plan.device_kind, plan.platform, local_devices, cfg.model.dtype)
    data_lib = _data()
    local_batches = data_lib.train_batches(cfg.data, cfg.model.seq_len, plan.global_batch, pidx, pcount,
                                           start_step=start)
    loop = _Loop(cfg, program, peak, writer, report, start, peak_meter)
    batches = Prefetcher(local_batches, lambda b: _to_global(b, program.batch_sharding, plan.global_batch),
                         depth=prefetch)
    stopped = False
    step = start
    try:
        for step in range(start + 1, cfg.steps + 1):
            state, metrics = program.compiled_step(state, next(batches))
            if ckpt and ckpt.due(step):
                _save(ckpt, step, state, writer)
                loop.exclude(ckpt.last_blocking_s)  # out of the interval's step time
            if loop.should_log(step, start):
                if loop.log(step, start, state, metrics):
                    stopped = True
                    break
        if ckpt:
            _save(ckpt, step, state, writer, force=True)  # after the last interval: in no step time
    finally:
        batches.close()
        if ckpt:
            ckpt.close()  # waits for the last write
            writer.scalars(step, {"checkpoint/final_wait_s": ckpt.seconds().final_wait_s})
        writer.close()
        loop.close()
    return TrainResult(plan=plan, history=loop.history, final=loop.history[-1] if loop.history else None,
                       steps_run=step - start, stopped_early=stopped, eval_loss=loop.last_eval,
                       run_dir=run_dir, start_step=start, checkpoint_seconds=ckpt.seconds() if ckpt else None)


def _save(ckpt, step: int, state, writer: ScalarWriter, force: bool = False) -> None:
    """Save `state` as `step` (trainer/checkpoint.py): first wait for the step that computes it
    (that is the step's own time, not the save's), then for the save's blocking part only."""
    jax.block_until_ready(state)
    if ckpt.maybe_save(step, state, force=force):
        writer.scalars(step, {"checkpoint/blocking_s": ckpt.last_blocking_s,
                              "checkpoint/waiting_for_previous_s": ckpt.last_waiting_s})


def _data():
    """trainer/data.py, imported on first use: it imports seqio and TensorFlow (~6 CPU-s), which a
    process that only plans (a plan-only trial worker, a memory refusal) never needs."""
    from . import data

    return data


def check_vocab(cfg: TrainConfig) -> None:
    """The model's vocabulary holds the data's tokens; ConfigError (one line) otherwise."""
    data_vocab = _data().data_vocab_size(cfg.data)
    if cfg.model.vocab_size < data_vocab:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the data vocabulary "
                          f"({data_vocab}); set model.vocab_size >= {data_vocab}")


def _to_global(local: dict, sharding, global_batch: int) -> dict:
    return {k: jax.make_array_from_process_local_data(sharding, v, (global_batch,) + v.shape[1:])
            for k, v in local.items()}


class _Loop:
    """Logging-interval bookkeeping: timing, metrics, eval, divergence, TensorBoard, progress."""

    def __init__(self, cfg: TrainConfig, program: Program, peak_flops: float, writer: ScalarWriter, report,
                 start: int, peak_meter: distributed.PeakMeter):
        self.cfg, self.program, self.peak, self.writer, self.report = cfg, program, peak_flops, writer, report
        self.peak_meter = peak_meter
        self.history: list[StepMetrics] = []
        self.first_loss: float | None = None
        self.last_eval: float | None = None
        self.t_mark = time.perf_counter()
        self.n_mark = start
        self.checkpoint_s = 0.0  # seconds blocked in saves since t_mark, kept out of step time
        self._state_params = None
        self._eval_fn: Callable[..., Any] | None = None
        self._eval_batches: list[data_lib.Batch] | None = None
        self.bar = None
        if cfg.log.progress and jax.process_index() == 0:
            from tqdm import tqdm
            self.bar = tqdm(total=cfg.steps, desc="train", unit="step", dynamic_ncols=True)

    def should_log(self, step: int, start: int) -> bool:
        warm = start + self.cfg.warmup_steps_for_timing
        return (step == start + 1 or step == warm or step % self.cfg.log.every_steps == 0
                or step == self.cfg.steps)

    def exclude(self, seconds: float) -> None:
        """Keep `seconds` (the loop blocked in a checkpoint save) out of this interval's step time."""
        self.t_mark += seconds
        self.checkpoint_s += seconds

    def log(self, step: int, start: int, state, metrics) -> bool:
        m = jax.device_get(metrics)  # the only host sync: at logging intervals
        now = time.perf_counter()
        loss = float(m["loss"])
        if self.first_loss is None:
            self.first_loss = loss
        if not math.isfinite(loss) or loss > DIVERGENCE_FACTOR * self.first_loss + 1.0:
            raise NonFiniteLoss(f"loss diverged at step {step}: {loss:.4g} (first step {self.first_loss:.4g})", step)
        # Each interval is timed on its own; logging at the warm-up boundary keeps the
        # first steps (dispatch and allocation warm-up) out of the later intervals.
        step_time = (now - self.t_mark) / (step - self.n_mark)  # checkpoint saves excluded (exclude())
        self._state_params = state["params"]
        stop = self._emit(step, m, step_time)
        self.t_mark, self.n_mark = time.perf_counter(), step  # eval and logging stay out of step time
        self.checkpoint_s = 0.0
        return stop

    def _emit(self, step: int, m: dict, step_time: float) -> bool:
        plan = self.program.plan
        st = step_time
        per_dev_model = plan.model_flops_per_step / plan.num_devices / st
        eval_loss = None
        due_eval = self.cfg.eval.enabled and (
            step == self.cfg.steps or (self.cfg.eval.every_steps and step % self.cfg.eval.every_steps == 0))
        if due_eval:
            eval_loss = self.last_eval = self.evaluate()
        sm = StepMetrics(
            step=step, loss=float(m["loss"]), log_pplx=float(m["loss"]), learning_rate=float(m["learning_rate"]),
            grad_norm=float(m["grad_norm"]), param_norm=float(m["param_norm"]), step_time=st,
            steps_per_sec=1.0 / st, tokens_per_sec=plan.tokens_per_step / st,
            model_tflops_per_device=per_dev_model / 1e12, mfu=per_dev_model / self.peak,
            hfu=plan.xla_flops_per_step / st / self.peak, compiled_peak_bytes=plan.peak_bytes,
            measured_peak_bytes=self.peak_meter.read(), eval_loss=eval_loss,
            checkpoint_s=self.checkpoint_s,
            **{k: float(m[k]) for k in ("load_balance_loss", "dropped_fraction") if k in m})
        self.history.append(sm)
        self.writer.scalars(step, {f"train/{k}": v for k, v in sm.to_dict().items()
                                   if k not in ("step", "eval_loss") and isinstance(v, (int, float))})
        if eval_loss is not None:
            self.writer.scalars(step, {"eval/loss": eval_loss, "eval/log_pplx": eval_loss})
        self.writer.flush()
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(loss=f"{sm.loss:.3f}", tok_s=f"{sm.tokens_per_sec:,.0f}", mfu=f"{sm.mfu:.1%}")
        return bool(self.report(sm)) if self.report else False

    def evaluate(self) -> float:
        cfg, program = self.cfg, self.program
        if self._eval_fn is None or self._eval_batches is None:
            params_sh = (program.device_shardings or program.state_shardings)["params"]
            with program.context():
                self._eval_fn = jax.jit(make_eval_step(program.model),
                                        in_shardings=(params_sh, program.batch_sharding))
            self._eval_batches = _data().eval_batches(
                cfg.data, cfg.model.seq_len, program.plan.global_batch, jax.process_index(),
                jax.process_count(), max_batches=cfg.eval.max_batches)
        total, weight = 0.0, 0.0
        params = self.program.params_on_device(self._state_params)
        for local in self._eval_batches:
            batch = _to_global(local, program.batch_sharding, program.plan.global_batch)
            with program.context():
                s, w = self._eval_fn(params, batch)
            total, weight = total + float(s), weight + float(w)
        return total / max(weight, 1.0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
