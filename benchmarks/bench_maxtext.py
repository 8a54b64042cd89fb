"""The shared trainer against MaxText 0.2.5 (issue 9 part 3): tokens/s side by side, alternated.

Question: is the shared trainer at least as fast as MaxText on the same model and devices?
Peer: MaxText 0.2.5's tokens/s, same jax, the two sides alternated.

Both sides run in subprocesses of one Python with one jax (MaxText needs Python >= 3.12):

    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/mt312
    /work/mt312/bin/pip install "maxtext[tpu]==0.2.5"
    /work/mt312/bin/pip install -e .            # paxsearch (keeps MaxText's jax)
    /work/mt312/bin/python benchmarks/bench_maxtext.py --repeats 3
    /work/mt312/bin/python benchmarks/bench_maxtext.py --cases dense-f32-fsdp8,llama-bf16-1dev

MaxText: `python -m maxtext.trainers.pre_train.train` with its synthetic dataset, on CPU
(hardware=cpu: dot-product attention), checkpoints and TensorBoard off. paxsearch:
trainer.train.train on its seqio synthetic task (prefetched). Same model, mesh, per-device
batch, sequence, dtype (activations; float32 weights on both), remat policy, steps. The first
`--warmup` steps are excluded on both sides: MaxText's per-step "seconds" (wall time between
step dispatches) summed over the later steps; paxsearch's logging interval over the same steps.

Cases: {dense, llama} x {f32, bf16} x {fsdp8: 8 simulated devices, fsdp 8, batch 1/device;
1dev: 1 device, batch 8; pp2: 8 simulated devices, 2 pipeline stages x fsdp 4, 2 microbatches,
GPipe, global batch 8}. "dense" is the issue's non-gated model (gelu, tanh approximation);
"llama" is MaxText's default block (SwiGLU, RoPE); both at d_model 256, 4 layers, 4 heads
of 64, d_ff 1024, vocab 1024, seq 256, RoPE positions, untied unembedding.

Mixtures of experts (issue 43 section 4; asked for by name, e.g. --cases moecap-f32-ep4,moe-f32-ep4):
{moe: dropless, moecap: capacity factor 1.25} x {f32, bf16} x {ep2, ep4: 8 simulated devices, fsdp 4 x
expert 2 or fsdp 2 x expert 4, batch 1/device}. The llama body with every MLP a MoE layer: 8 SwiGLU
experts of width 1024, top-2 softmax routing, no shared expert, no leading dense layer (MaxText's mixtral
block has neither), load-balancing weight 0.01 on both sides. MaxText's keys: _maxtext_moe().
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

DIMS = dict(d_model=256, n_layers=4, n_heads=4, head_dim=64, d_ff=1024, vocab_size=1024, seq_len=256)
MODELS = {"dense": dict(mlp="dense", activation="gelu"), "llama": dict(mlp="gated", activation="silu")}
MESHES = {"fsdp8": (8, 1), "1dev": (1, 8), "pp2": (8, 1), "ep2": (8, 1), "ep4": (8, 1)}  # (devices, per-device batch)
# pp2 (issue 19 section 7): 2 pipeline stages x fsdp 4, 2 microbatches of 4 rows (MaxText needs a microbatch
# divisible over fsdp), GPipe (MaxText: 2 layers a stage)
PIPELINES = {"pp2": dict(stages=2, microbatches=2)}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
CASES = [f"{m}-{d}-{mesh}" for m in MODELS for d in DTYPES for mesh in ("fsdp8", "1dev")]
PIPELINE_CASES = [f"{m}-{d}-pp2" for m in MODELS for d in DTYPES]  # asked for by name (--cases)
# Mixtures of experts (issue 43 section 4): the llama body with every MLP a MoE layer of 8 SwiGLU experts of width
# d_ff, top-2 softmax routing (renormalized), no shared expert, no leading dense layer, load-balancing weight 0.01;
# "moecap": capacity factor 1.25 (tokens over capacity dropped), "moe": dropless. On 8 devices, expert parallelism
# 2 or 4 over the fsdp axis's rest (ep4: fsdp 2 x expert 4). Asked for by name (--cases).
EXPERTS = {"ep2": 2, "ep4": 4}  # mesh: its expert axis size
MOE = dict(n_experts=8, experts_per_token=2, expert_d_ff=DIMS["d_ff"], load_balance_weight=0.01)
MOE_COMPUTE = {"moe": ("dropless", -1.0), "moecap": ("capacity", 1.25)}  # ours, MaxText's capacity_factor
MODELS.update({name: MODELS["llama"] for name in MOE_COMPUTE})
MOE_CASES = [f"{m}-{d}-{mesh}" for m in MOE_COMPUTE for d in DTYPES for mesh in EXPERTS]
MAXTEXT_ACTIVATIONS = {"dense": '["gelu"]', "llama": '["silu","linear"]', "moe": '["silu","linear"]',
                       "moecap": '["silu","linear"]'}
STEP_LINE = re.compile(r"completed step: (\d+), seconds: ([0-9.]+)")


def _parse(case: str):
    parts = case.split("-")
    if len(parts) != 3 or parts[0] not in MODELS or parts[1] not in DTYPES or parts[2] not in MESHES:
        raise SystemExit(f"unknown case {case!r}; cases: {', '.join(CASES + PIPELINE_CASES + MOE_CASES)}")
    model, dtype, mesh = parts
    if (model in MOE_COMPUTE) != (mesh in EXPERTS):
        raise SystemExit(f"case {case!r}: the MoE models ({', '.join(MOE_COMPUTE)}) go with an expert mesh "
                         f"({', '.join(EXPERTS)}), the dense ones with the others")
    devices, per_device_batch = MESHES[mesh]
    return model, DTYPES[dtype], devices, per_device_batch


def _env(devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env.pop("PAXSEARCH_FLAG_SET", None)
    return env


def maxtext_cmd(case: str, steps: int, remat: str, out_dir: str) -> list[str]:
    model, dtype, devices, pdb = _parse(case)
    mesh = case.split("-")[2]
    d = DIMS
    return [sys.executable, "-m", "maxtext.trainers.pre_train.train",
            f"run_name={case}", f"base_output_directory={out_dir}", "dataset_type=synthetic",
            "hardware=cpu", "skip_jax_distributed_system=true", f"steps={steps}",
            "enable_checkpointing=false", "enable_tensorboard=false",
            f"base_emb_dim={d['d_model']}", f"base_num_query_heads={d['n_heads']}",
            f"base_num_kv_heads={d['n_heads']}", f"head_dim={d['head_dim']}", f"base_mlp_dim={d['d_ff']}",
            f"base_num_decoder_layers={d['n_layers']}", f"vocab_size={d['vocab_size']}",
            f"max_target_length={d['seq_len']}", f"mlp_activations={MAXTEXT_ACTIVATIONS[model]}",
            f"dtype={dtype}", "weight_dtype=float32", f"per_device_batch_size={pdb}",
            f"remat_policy={remat}"] + _maxtext_mesh(mesh, devices) + _maxtext_moe(model)


def _maxtext_moe(model: str) -> list[str]:
    """MaxText 0.2.5's MoE keys (configs/base.yml) for our MOE fields, through its dense_matmul (sparse_matmul=false,
    megablox=false), the path MaxText's CPU runs can take: capacity_factor 1.25 dispatches and combines with one-hot
    masks (its capacity is per sequence, ceil(k x seq / E) x factor; ours per device: the same at 1 sequence a
    device); capacity_factor -1 (dropless) runs every expert on every token, weighted by the routing (E / k x the
    routed work). Its sparse_matmul (dropless, jax.lax.ragged_dot) does not run here with expert parallelism: its
    ragged_all_to_all is not implemented by XLA:CPU (jax 0.12.1), and use_ring_of_experts=true with megablox=false
    stops in jax.lax.ragged_dot ("expected rhs group dimension size to be 8, got 2": all experts' group sizes
    against the local experts' weights)."""
    if model not in MOE_COMPUTE:
        return []
    from paxsearch.search.export.maxtext import per_route_weight

    return ["decoder_block=mixtral", f"num_experts={MOE['n_experts']}",
            f"num_experts_per_tok={MOE['experts_per_token']}",
            f"base_moe_mlp_dim={MOE['expert_d_ff']}", f"capacity_factor={MOE_COMPUTE[model][1]}",
            "sparse_matmul=false", "megablox=false",
            # MaxText's loss counts each of a token's k routes: its weight is ours / k (search/export/maxtext.py)
            f"load_balance_loss_weight={per_route_weight(MOE['load_balance_weight'], MOE['experts_per_token'])}"]


def _maxtext_mesh(mesh: str, devices: int) -> list[str]:
    if mesh in EXPERTS:
        return [f"ici_fsdp_parallelism={devices // EXPERTS[mesh]}", f"ici_expert_parallelism={EXPERTS[mesh]}"]
    pipe = PIPELINES.get(mesh)
    if pipe is None:
        return [f"ici_fsdp_parallelism={devices}"]
    stages = pipe["stages"]
    return [f"ici_pipeline_parallelism={stages}", f"ici_fsdp_parallelism={devices // stages}",
            f"num_pipeline_microbatches={pipe['microbatches']}",
            f"num_layers_per_pipeline_stage={DIMS['n_layers'] // stages}"]


def run_maxtext(case: str, steps: int, warmup: int, remat: str) -> dict:
    _, _, devices, pdb = _parse(case)
    out_dir = f"/tmp/bench_maxtext/{case}-{time.time_ns()}"
    proc = subprocess.run(maxtext_cmd(case, steps, remat, out_dir), env=_env(devices), capture_output=True,
                          text=True, timeout=1800)
    seconds = {int(s): float(t) for s, t in STEP_LINE.findall(proc.stdout + proc.stderr)}
    if proc.returncode or len(seconds) < steps:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"MaxText run {case} failed (rc {proc.returncode}, {len(seconds)} steps):\n{tail}")
    timed = [seconds[s] for s in range(warmup, steps)]
    return {"tokens_per_s": pdb * devices * DIMS["seq_len"] * len(timed) / sum(timed),
            "step_s": sum(timed) / len(timed)}


def paxsearch_side(case: str, steps: int, warmup: int, remat: str, prefetch: int) -> dict:
    """Runs in its own process (device count set before JAX starts)."""
    from paxsearch.trainer.config import (
        CheckpointConfig,
        EvalConfig,
        LogConfig,
        MeshConfig,
        ModelConfig,
        PipelineConfig,
        TrainConfig,
        mesh_shape,
    )
    from paxsearch.trainer.train import train

    model, dtype, devices, pdb = _parse(case)
    moe = {}
    if model in MOE_COMPUTE:
        compute, factor = MOE_COMPUTE[model]
        moe = dict(MOE, expert_compute=compute, **({"capacity_factor": factor} if compute == "capacity" else {}))
    m = ModelConfig(**DIMS, **MODELS[model], **moe, position="rope", dtype=dtype, param_dtype="float32",
                    attention="dot_product", tie_embeddings=False)
    mesh = case.split("-")[2]
    pipe = PIPELINES.get(mesh)
    if mesh in EXPERTS:  # the batch splits over fsdp x expert (trainer/moe.py BATCH_AXES), as MaxText's
        layout = dict(mesh=MeshConfig(ici=mesh_shape(fsdp=devices // EXPERTS[mesh], expert=EXPERTS[mesh])),
                      per_device_batch=pdb)
    elif pipe is None:
        layout = dict(mesh=MeshConfig(ici=(1, devices, 1)), per_device_batch=pdb)
    else:  # MaxText's global batch: per_device_batch_size x every device (ours counts the batch axes' only)
        stages = pipe["stages"]
        layout = dict(mesh=MeshConfig(ici=mesh_shape(stage=stages, fsdp=devices // stages)), per_device_batch=None,
                      global_batch=pdb * devices, pipeline=PipelineConfig(pipe["microbatches"]))
    cfg = TrainConfig(model=m, **layout, steps=steps,
                      remat=remat, warmup_steps_for_timing=warmup, eval=EvalConfig(enabled=False),
                      checkpoint=CheckpointConfig(enabled=False),
                      log=LogConfig(every_steps=steps, tensorboard=False))
    final = train(cfg, prefetch=prefetch).final
    return {"tokens_per_s": final.tokens_per_sec, "step_s": final.step_time}


def run_paxsearch(case: str, steps: int, warmup: int, remat: str, prefetch: int) -> dict:
    _, _, devices, _ = _parse(case)
    cmd = [sys.executable, __file__, "--side", "paxsearch", "--cases", case, "--steps", str(steps),
           "--warmup", str(warmup), "--remat", remat, "--prefetch", str(prefetch)]
    proc = subprocess.run(cmd, env=_env(devices), capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"paxsearch run {case} failed (rc {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated, from {CASES + PIPELINE_CASES + MOE_CASES}")
    p.add_argument("--repeats", type=int, default=3, help="alternated MaxText/paxsearch pairs per case")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5, help="first steps excluded on both sides")
    p.add_argument("--remat", default="full", help="remat policy on both sides (MaxText's default: full)")
    p.add_argument("--prefetch", type=int, default=2, help="paxsearch input prefetch depth")
    p.add_argument("--out", default="/tmp/bench_maxtext.jsonl", help="one JSON line per run, appended")
    p.add_argument("--side", choices=("paxsearch",), help=argparse.SUPPRESS)
    a = p.parse_args()
    cases = a.cases.split(",")
    if a.side:
        print(json.dumps(paxsearch_side(cases[0], a.steps, a.warmup, a.remat, a.prefetch)), flush=True)
        return
    import jax
    print(f"jax {jax.__version__}, python {sys.version.split()[0]}, steps {a.steps} (first {a.warmup} excluded), "
          f"remat {a.remat}, load {os.getloadavg()[0]:.1f}", flush=True)
    summary = []
    for case in cases:
        mt, px = [], []
        for r in range(a.repeats):
            # alternate which side goes first, so a load trend does not favour one side
            order = ("maxtext", "paxsearch") if r % 2 == 0 else ("paxsearch", "maxtext")
            for side in order:
                res = (run_maxtext(case, a.steps, a.warmup, a.remat) if side == "maxtext"
                       else run_paxsearch(case, a.steps, a.warmup, a.remat, a.prefetch))
                res.update(case=case, side=side, repeat=r, load=os.getloadavg()[0], remat=a.remat, jax=jax.__version__)
                (mt if side == "maxtext" else px).append(res["tokens_per_s"])
                with open(a.out, "a") as f:
                    f.write(json.dumps(res) + "\n")
                print(json.dumps(res), flush=True)
        ratios = [x / y for x, y in zip(px, mt, strict=True)]
        row = {"case": case, "maxtext_tok_s": statistics.median(mt), "paxsearch_tok_s": statistics.median(px),
               "ratios": [round(r, 3) for r in ratios], "median_ratio": statistics.median(ratios)}
        summary.append(row)
        print(json.dumps(row), flush=True)
    print("\n| case | MaxText tok/s | paxsearch tok/s | ratio (median of pairs) | pairs |\n|---|---|---|---|---|")
    for row in summary:
        print(f"| {row['case']} | {row['maxtext_tok_s']:,.0f} | {row['paxsearch_tok_s']:,.0f} | "
              f"**{row['median_ratio']:.2f}** | {', '.join(f'{r:.2f}' for r in row['ratios'])} |")


if __name__ == "__main__":
    main()
