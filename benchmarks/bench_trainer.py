"""Trainer benchmarks (issue 2). Each part runs in its own process so the device count is set
before JAX starts; inside a part, the compared runs alternate in one process.

Question: is the trainer as fast as a hand-written step, how long does it compile, what MFU does it
reach?
Peer: a hand-written `jax.jit` step of the same math (throughput); 2 layers (compile); the CPU's
measured matmul peak (mfu).

  python benchmarks/bench_trainer.py throughput   # trainer tokens/s vs a hand-written jax.jit step
  python benchmarks/bench_trainer.py compile      # compile seconds, 24 layers vs 2 layers
  python benchmarks/bench_trainer.py mfu          # MFU on 1 CPU device vs the measured matmul peak
  python benchmarks/bench_trainer.py mfu_relu     # the same with a relu MLP (XLA:CPU's tanh is slow)
  python benchmarks/bench_trainer.py all
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _setup(devices: int) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _handwritten_step(m, tx):
    """The trainer's math written directly in jax.numpy: no Flax, no logical axes."""
    import jax
    import jax.numpy as jnp
    import optax

    def rms(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    def block(x, p_seg):
        p, seg = p_seg
        h = rms(x, p["n1"])
        q, k, v = (jnp.einsum("bse,ehd->bshd", h, p[w]) for w in ("q", "k", "v"))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * m.head_dim ** -0.5
        qi, ki = jnp.arange(m.seq_len)[:, None], jnp.arange(m.seq_len)[None, :]
        mask = (qi >= ki)[None] & (seg[:, :, None] == seg[:, None, :])
        s = jnp.where(mask[:, None], s, jnp.finfo(jnp.float32).min)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
        x = x + jnp.einsum("bshd,hde->bse", a, p["o"])
        h = rms(x, p["n2"])
        return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    def loss_fn(params, batch):
        x = params["embed"][batch["inputs"]] + params["pos"][batch["positions"]]
        seg = batch["segment_ids"]
        x, _ = jax.lax.scan(lambda c, p: (block(c, (p, seg)), None), x, params["layers"])
        logits = rms(x, params["nf"]) @ params["unembed"]
        tl = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
        return jnp.sum(tl * batch["weights"]) / jnp.maximum(jnp.sum(batch["weights"]), 1.0)

    def step(state, batch):
        params, opt = state
        loss, g = jax.value_and_grad(loss_fn)(params, batch)
        upd, opt = tx.update(g, opt, params)
        return (optax.apply_updates(params, upd), opt), loss

    def init(key):
        L, d, H, D, F, V, S = m.n_layers, m.d_model, m.n_heads, m.head_dim, m.d_ff, m.vocab_size, m.seq_len
        ks = iter(jax.random.split(key, 10))
        n = lambda shape, fan: jax.random.normal(next(ks), shape) * fan ** -0.5
        layers = {"q": n((L, d, H, D), d), "k": n((L, d, H, D), d), "v": n((L, d, H, D), d),
                  "o": n((L, H, D, d), H * D), "w1": n((L, d, F), d), "w2": n((L, F, d), F),
                  "n1": jnp.ones((L, d)), "n2": jnp.ones((L, d))}
        params = {"embed": n((V, d), 1), "pos": n((S, d), 2500), "layers": layers, "nf": jnp.ones((d,)),
                  "unembed": n((d, V), d)}
        return params, tx.init(params)

    return step, init


def throughput(steps: int = 30, rounds: int = 3) -> dict:
    _setup(8)
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from paxsearch.trainer import data as data_lib
    from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig
    from paxsearch.trainer.mesh import build_mesh
    from paxsearch.trainer.plan import build_program
    from paxsearch.trainer.step import make_optimizer
    from paxsearch.trainer.train import train

    m = ModelConfig(d_model=256, n_layers=4, n_heads=4, head_dim=64, d_ff=1024, seq_len=128)
    cfg = TrainConfig(model=m, mesh=MeshConfig(ici=(8, 1, 1)), per_device_batch=2, steps=steps,
                      eval=EvalConfig(enabled=False), log=LogConfig(every_steps=steps, tensorboard=False),
                      warmup_steps_for_timing=5)
    program = build_program(cfg, count_flops=False)
    mesh = build_mesh(cfg.mesh, jax.devices())
    tx = make_optimizer(cfg.optimizer, steps)
    step, init = _handwritten_step(m, tx)
    rep, bsh = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    hand = jax.jit(step, in_shardings=((rep, rep), bsh), out_shardings=((rep, rep), rep), donate_argnums=0)
    batches = data_lib.train_batches(cfg.data, m.seq_len, 16, 0, 1)
    fixed = {k: jax.device_put(v, bsh) for k, v in next(batches).items()}

    def run_hand():
        state = jax.jit(init, out_shardings=(rep, rep))(jax.random.key(0))
        for _ in range(5):
            state, loss = hand(state, fixed)
        loss.block_until_ready()
        t = time.perf_counter()
        for _ in range(steps - 5):
            state, loss = hand(state, {k: jax.device_put(v, bsh) for k, v in next(batches).items()})
        loss.block_until_ready()
        return 16 * m.seq_len * (steps - 5) / (time.perf_counter() - t)

    def run_trainer():
        return train(cfg, program=program).final.tokens_per_sec

    ratios, t_tr, t_hd = [], [], []
    for _ in range(rounds):
        a, b = run_trainer(), run_hand()
        t_tr.append(a), t_hd.append(b), ratios.append(a / b)
    return {"trainer_tokens_per_s": t_tr, "handwritten_tokens_per_s": t_hd, "ratio": ratios,
            "median_ratio": sorted(ratios)[len(ratios) // 2]}


def compile_time(rounds: int = 2) -> dict:
    _setup(8)
    from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
    from paxsearch.trainer.plan import plan

    def secs(layers):
        m = ModelConfig(d_model=256, n_layers=layers, n_heads=4, head_dim=64, d_ff=1024, seq_len=128)
        cfg = TrainConfig(model=m, mesh=MeshConfig(ici=(2, 2, 2)), per_device_batch=2, remat="minimal")
        return plan(cfg, count_flops=False).compile_seconds

    secs(2)  # warm the compiler
    rows = [(secs(2), secs(24)) for _ in range(rounds)]
    ratios = [b / a for a, b in rows]
    return {"two_layers_s": [a for a, _ in rows], "twenty_four_layers_s": [b for _, b in rows], "ratio": ratios}


def mfu(steps: int = 12, activation: str = "gelu") -> dict:
    _setup(1)
    from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig
    from paxsearch.trainer.flops import _measure_matmul, measured_cpu_peak
    from paxsearch.trainer.train import train

    m = ModelConfig(d_model=512, n_layers=4, n_heads=8, head_dim=64, d_ff=2048, seq_len=256, activation=activation)
    cfg = TrainConfig(model=m, mesh=MeshConfig(ici=(1, 1, 1)), per_device_batch=16, steps=steps,
                      eval=EvalConfig(enabled=False), warmup_steps_for_timing=2,
                      log=LogConfig(every_steps=steps, tensorboard=False))
    # The machine is shared: measure the matmul peak right before and after the run and
    # report MFU against that side-by-side figure as well as against the cached one.
    before = _measure_matmul("float32")
    final = train(cfg).final
    after = _measure_matmul("float32")
    side_by_side = max(before, after)
    achieved = final.model_tflops_per_device * 1e12
    return {"activation": activation, "mfu_vs_cached_peak": final.mfu, "hfu": final.hfu, "step_time_s": final.step_time,
            "achieved_gflops": achieved / 1e9, "cached_peak_gflops": measured_cpu_peak("float32") / 1e9,
            "side_by_side_peak_gflops": side_by_side / 1e9, "mfu_vs_side_by_side_peak": achieved / side_by_side}


PARTS = {"throughput": throughput, "compile": compile_time, "mfu": mfu,
         "mfu_relu": lambda: mfu(activation="relu")}

if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which not in ("all", *PARTS):
        sys.exit(f"usage: bench_trainer.py [all | {' | '.join(PARTS)}] (got {which!r})")
    if which == "all":
        for part in PARTS:
            subprocess.run([sys.executable, __file__, part], check=True)
    else:
        print(json.dumps({which: PARTS[which]()}, indent=1), flush=True)
