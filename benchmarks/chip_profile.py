"""Planned against measured, bucket by bucket, for real training steps on one chip (issue 41,
section 2, "The chip's own figures").

Question: which bucket of the roofline does a plan misprice, on real training steps of one chip?
Peer: the chip's own jax.profiler trace of the same steps, bucket by bucket.

Each config is built through the trainer (trainer/plan.py build_program, keep_hlo), priced by the
roofline (search/planning/predict.py predict with hardware_for(devices): the v5e's figures on a v5e), run
for --warm steps, timed for --steps steps (wall, dispatched back to back), then traced for --steps
steps with jax.profiler (each step blocked inside a StepTraceAnnotation "train"). The trace is read
without xprof (search/planning/roofline/trace.py: jax.profiler.ProfileData), each measured op is looked up
in the compiled step's optimized HLO and put in the roofline's bucket (matmul, attention kernel,
other on-chip, collectives, host transfers, control); the predicted buckets are the roofline's own
per-op prices of the same HLO. Device time: the program's executions on the device's "XLA Modules"
line (TPU); on CPU the host's step annotations.

    python3 benchmarks/chip_profile.py --out $OUT/profile            # on the chip: 0.31B Llama-style configs
    python benchmarks/chip_profile.py --tiny --out /tmp/profile      # CPU: tiny models, end to end

Writes ONE file, <out>/chip_profile.json (rewritten after every config, so a run cut short keeps
what it finished), and prints one table per config. --budget-s: configs not started within it are
skipped (recorded as such).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import itertools
import json
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

# The configs: name -> (attention, remat, per-device batch, what it shows)
# (v5e-1 compile-only plans of them, libtpu 0.0.52: peak 8.0, 5.6 (b2: 9.65), 6.1 and 5.5 GiB; dot_product at
# 2 rows per chip planned 15.7 GiB, too near the chip's 16)
CONFIGS = {
    "dot_b1": ("dot_product", "none", 1, "plain attention: the S x S scores through HBM"),
    "flash_b1": ("flash", "none", 1, "the same step with the splash kernels in place of the scores"),
    "flash_full_b8": ("flash", "full", 8, "full remat at 8x the batch: recomputed forward, larger matmuls"),
    "flash_offload_b4": ("flash", "offload", 4, "remat 'offload': saved activations to host memory and back"),
}
DEFAULT_CONFIGS = "dot_b1,flash_b1,flash_full_b8,flash_offload_b4"
OUT_FILE = "chip_profile.json"


def model_config(tiny: bool):
    """The Llama-style model: ~0.31B parameters (16 layers of d 1024, 8 heads of 128 with 2 K/V
    heads, gated silu MLP of 4096, rope, vocabulary 32000, sequence 2048, bf16 activations), or a
    tiny one for CPU."""
    from paxsearch.trainer.config import ModelConfig

    if tiny:
        return ModelConfig(vocab_size=384, d_model=64, n_layers=2, n_heads=4, head_dim=16, n_kv_heads=2, d_ff=128,
                           seq_len=128, dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu",
                           position="rope", attention_block=64)
    return ModelConfig(vocab_size=32000, d_model=1024, n_layers=16, n_heads=8, head_dim=128, n_kv_heads=2,
                       d_ff=4096, seq_len=2048, dtype="bfloat16", param_dtype="float32", mlp="gated",
                       activation="silu", position="rope")


ONCHIP_SPACE = "onchip_v5e.py"  # --onchip: points of spaces/onchip_v5e.py, each the whole trainer config it names


def onchip_config(name: str):
    """The TrainConfig of point `name` of spaces/onchip_v5e.py (as its study trains it on the chip)."""
    import fiddle as fdl

    from paxsearch import spaces
    from paxsearch.search.study.space import load_space

    space = load_space(os.path.join(os.path.dirname(spaces.__file__), ONCHIP_SPACE))
    points = space.decision("point").values
    if name not in points:
        raise SystemExit(f"--onchip {name}: not a point of spaces/{ONCHIP_SPACE}; e.g. {', '.join(points[:3])}")
    others = [d for d in ("half", "kind") if d in {x.name for x in space.all_decisions}]
    choice = next(c for c in itertools.product(*(space.decision(d).values for d in others))
                  if not space.excluded({"point": name, **dict(zip(others, c, strict=True))}))
    return fdl.build(space.config({"point": name, **dict(zip(others, choice, strict=True))}))


def describe(name: str) -> str:
    return CONFIGS[name][3] if name in CONFIGS else f"spaces/{ONCHIP_SPACE} point {name}"


def train_config(name: str, tiny: bool):
    from paxsearch.trainer.config import CheckpointConfig, EvalConfig, LogConfig, MeshConfig, TrainConfig

    if name not in CONFIGS:
        return onchip_config(name)
    attention, remat, batch, _ = CONFIGS[name]
    model = dataclasses.replace(model_config(tiny), attention=attention)
    return TrainConfig(model=model, mesh=MeshConfig(ici=(1, 1, 1)), per_device_batch=batch, remat=remat, steps=100,
                       eval=EvalConfig(enabled=False), checkpoint=CheckpointConfig(enabled=False),
                       log=LogConfig(tensorboard=False))


def synthetic_batch(program, seed: int = 0) -> dict:
    """Random tokens, one document per row, on the program's batch sharding."""
    import jax
    import numpy as np

    m = program.cfg.model
    gb, s = program.plan.global_batch, m.seq_len
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, m.vocab_size, (gb, s + 1)).astype(np.int32)
    host = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": np.ones((gb, s), np.float32),
            "segment_ids": np.ones((gb, s), np.int32),
            "positions": np.broadcast_to(np.arange(s, dtype=np.int32), (gb, s)).copy()}
    return {k: jax.device_put(v, program.batch_sharding) for k, v in host.items()}


def build(name: str, tiny: bool, devices) -> tuple:
    """(program, seconds) of one config: build_program with its optimized HLO kept."""
    from paxsearch.search.planning.predict import hlo_cost
    from paxsearch.trainer.plan import build_program

    t0 = time.perf_counter()
    program = build_program(train_config(name, tiny), devices, keep_hlo=True, hlo_flops=hlo_cost)
    return program, time.perf_counter() - t0


def profile_one(name: str, program, compile_s: float, devices, warm: int, steps: int, log,
                save_to: str | None = None) -> dict:
    import jax

    from paxsearch.search.planning.predict import hardware_for, predict
    from paxsearch.search.planning.roofline import trace as trace_lib

    cfg = program.cfg
    out: dict = {"config": name, "what": describe(name), "attention": cfg.model.attention, "remat": cfg.remat,
                 "per_device_batch": cfg.per_device_batch, "seq_len": cfg.model.seq_len}
    plan = program.plan
    out.update(compile_s=compile_s, param_count=plan.param_count, hlo_source=plan.hlo_source,
               compiled_peak_bytes=plan.peak_bytes, model_flops_per_step=plan.model_flops_per_step,
               tokens_per_step=plan.tokens_per_step)
    log(f"  compiled in {compile_s:.1f} s: {plan.param_count / 1e9:.3f}B params, "
        f"peak {plan.peak_bytes / 2 ** 30:.2f} GiB, HLO from {plan.hlo_source}")
    if plan.hlo_text is None:
        raise RuntimeError(f"no optimized HLO: {plan.hlo_error}")
    hw = hardware_for(devices)
    pred = predict(program, hw)
    out.update(hardware=hw.name, predicted_step_s=pred.step_time_s, predicted_mfu=pred.mfu,
               predicted_roofline=_small_roofline(pred.roofline))
    t1 = time.perf_counter()
    state = program.init_state(jax.random.key(0))
    batch = synthetic_batch(program)
    metrics = None
    for _ in range(warm):
        state, metrics = program.compiled_step(state, batch)
    jax.block_until_ready(metrics)
    out["warm_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    for _ in range(steps):
        state, metrics = program.compiled_step(state, batch)
    jax.block_until_ready((state, metrics))
    wall = (time.perf_counter() - t2) / steps
    out["loss_after_warm"] = float(metrics["loss"]) if metrics is not None else None
    log(f"  warm {warm} steps in {out['warm_s']:.1f} s; wall {wall * 1e3:.2f} ms/step (back to back), "
        f"predicted {pred.step_time_s * 1e3 if pred.step_time_s else float('nan'):.2f} ms")
    with tempfile.TemporaryDirectory(prefix="chip-profile-") as folder:
        t3 = time.perf_counter()
        with jax.profiler.trace(folder):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    state, metrics = program.compiled_step(state, batch)
                    jax.block_until_ready(metrics)
        out["trace_s"] = time.perf_counter() - t3
        path = trace_lib.newest_xplane(folder)
        out["xplane_bytes"] = os.path.getsize(path)
        rows = trace_lib.read_xplane(path)
    out["trace_planes"] = sorted({f"{r.plane} | {r.line}" for r in rows if r.on_device})[:40]
    out.update(trace_lib.compare(plan.hlo_text, hw, rows, steps, mesh=program.mesh, num_devices=plan.num_devices,
                         wall_step_s=wall))
    if save_to:
        save_step(save_to, name, plan.hlo_text, trace_lib.op_totals(rows, trace_lib.module_name(plan.hlo_text)), steps)
    m = out["measured_step_s"]
    out["measured_mfu"] = (plan.model_flops_per_step / plan.num_devices / m / hw.peak_flops) if m else None
    out["wall_mfu"] = plan.model_flops_per_step / plan.num_devices / wall / hw.peak_flops
    del state, batch, metrics, program
    gc.collect()
    return out


def save_step(folder: str, name: str, hlo_text: str, totals: dict, steps: int) -> None:
    """The chip compiler's optimized HLO of one step (`NAME.hlo.txt.gz`) and every op's measured time
    (`NAME.ops.json`: instruction -> [self seconds per step, executions per step]), so the roofline can be
    priced against the chip's own ops op by op on a machine without one (as tests/roofline/test_vmem_dma.py does)."""
    with gzip.open(os.path.join(folder, f"{name}.hlo.txt.gz"), "wt") as f:
        f.write(hlo_text)
    ops = {k: [t.self_ns * 1e-9 / max(steps, 1), t.count / max(steps, 1)] for k, t in totals.items()}
    with open(os.path.join(folder, f"{name}.ops.json"), "w") as f:
        json.dump(ops, f)


def _small_roofline(roof: dict) -> dict:
    keep = ("flops_per_step", "hbm_bytes_per_step", "compute_s", "memory_s", "roofline_s", "comm_s",
            "exposed_comm_s", "step_time_s", "overlap", "compiler_cycles_ops", "compiler_excess_s", "index_excess_s",
            "vpu_excess_s",
            "error")
    return {k: roof[k] for k in keep if k in roof}


def table(result: dict) -> str:
    """The config's buckets as a Markdown table (ms per step)."""
    lines = [f"{result['config']}: predicted step {_ms(result.get('predicted_step_s'))} ms, measured "
             f"{_ms(result.get('measured_step_s'))} ms ({result.get('measured_step_source')}), wall "
             f"{_ms(result.get('wall_step_s'))} ms; MFU predicted {_pct(result.get('predicted_mfu'))}, "
             f"measured {_pct(result.get('measured_mfu'))}",
             "| bucket | predicted ms | measured ms | predicted / measured |", "|---|---|---|---|"]
    for k, b in result.get("buckets", {}).items():
        p, m = b["predicted_s"], b["measured_s"]
        if p or m:
            lines.append(f"| {k} | {p * 1e3:.3f} | {m * 1e3:.3f} | {p / m if m else float('nan'):.2f} |")
    lines.append(f"| busy (sum) | {_ms(result.get('predicted_roofline_s'))} | {_ms(result.get('measured_busy_s'))} | |")
    return "\n".join(lines)


def _ms(x) -> str:
    return f"{x * 1e3:.3f}" if isinstance(x, (int, float)) else "-"


def _pct(x) -> str:
    return f"{x * 100:.1f}%" if isinstance(x, (int, float)) else "-"


def environment(devices) -> dict:
    import jax
    import jaxlib

    env = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "platform": devices[0].platform,
           "device_kind": devices[0].device_kind, "devices": len(jax.devices())}
    try:
        from importlib.metadata import version

        env["libtpu"] = version("libtpu")
    except Exception:  # noqa: BLE001 - not installed off TPU
        env["libtpu"] = None
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for chip_profile.json")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU test)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--onchip", default="", help=f"comma-separated points of spaces/{ONCHIP_SPACE} to profile "
                                                 "(after --configs; --configs '' for these alone)")
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=100.0, help="start no config after this many seconds")
    ap.add_argument("--parallel", type=int, default=4, help="configs compiled at once (threads)")
    ap.add_argument("--save-hlo", action="store_true",
                    help="also write each config's optimized HLO and per-op measured times into --out")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[chip_profile {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, OUT_FILE)
    import jax

    devices = jax.devices()[:1]
    log(f"devices: {devices[0].platform} {devices[0].device_kind} (using 1 of {len(jax.devices())})")
    doc: dict = {"what": "roofline buckets predicted vs measured per step (search/planning/roofline/trace.py)",
                 "environment": environment(devices), "tiny": args.tiny, "warm": args.warm, "steps": args.steps,
                 "model": dataclasses.asdict(model_config(args.tiny)), "results": []}
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    known = [n for n in names if n in CONFIGS]
    doc["results"] += [{"config": n, "skipped": f"unknown config; choose from {', '.join(CONFIGS)}"}
                       for n in names if n not in CONFIGS]
    for n in [c.strip() for c in args.onchip.split(",") if c.strip()]:
        onchip_config(n)  # an unknown point stops here, before anything compiles
        known.append(n)
    # the compiles run in threads (XLA compiles release the GIL; the trainer's mesh and rule contexts
    # are thread-local), the steps one config at a time in this thread
    pool = ThreadPoolExecutor(max_workers=max(1, min(args.parallel, len(known) or 1)))
    builds = {n: pool.submit(build, n, args.tiny, devices) for n in known}
    for name in known:
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            builds[name].cancel()
            log(f"{name}: skipped, {elapsed:.0f} s past the budget of {args.budget_s:.0f} s")
            doc["results"].append({"config": name, "skipped": f"budget: {elapsed:.0f} s > {args.budget_s:.0f} s"})
            continue
        log(f"{name}: {describe(name)}")
        t = time.perf_counter()
        program = None
        try:
            try:
                program, compile_s = builds[name].result(timeout=max(1.0, args.budget_s - elapsed))
            except FuturesTimeout:
                raise TimeoutError(f"not compiled within the budget of {args.budget_s:.0f} s") from None
            except Exception as e:  # noqa: BLE001 - a threaded build's failure: once more here, alone
                log(f"  the threaded build failed ({type(e).__name__}: {str(e)[:200]}); building in the main thread")
                program, compile_s = build(name, args.tiny, devices)
            result = profile_one(name, program, compile_s, devices, args.warm, args.steps, log,
                                 args.out if args.save_hlo else None)
            print(table(result), flush=True)
        except Exception as e:  # noqa: BLE001 - one config's failure must not lose the others
            result = {"config": name, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                      "traceback": traceback.format_exc()[-4000:]}
            log(f"{name}: FAILED {result['error'][:300]}")
        program = None  # drop the program (and the future holding it): its device memory goes with it
        builds[name] = None  # type: ignore[assignment]
        gc.collect()
        result["seconds"] = time.perf_counter() - t
        doc["results"].append(result)
        doc["total_s"] = time.perf_counter() - t_start
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    pool.shutdown(wait=False, cancel_futures=True)
    doc["total_s"] = time.perf_counter() - t_start
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    ok = sum(1 for r in doc["results"] if "buckets" in r)
    log(f"done: {ok} of {len(doc['results'])} configs profiled; wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # a compile still running in a thread (a config skipped for time) is not waited for
