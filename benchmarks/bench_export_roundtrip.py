"""Round trip through MaxText: a planned trial, exported, compiled by MaxText for the same TPU topology.

Question: is an exported config the model that was planned (FLOPs and memory)?
Peer: MaxText 0.2.5's `train_compile` of the exported script, for the same topology.

For each case below (a small model on a small TPU slice, compile-only on this CPU):
1. `paxsearch run` plans one trial of the case's config for the target (tpu:v5e-4 = v5e 2x2)
   and stores it (peak bytes per chip from XLA's memory_analysis, XLA FLOPs per chip and
   step from the optimized HLO through search/planning/roofline);
2. `paxsearch export RUN --trial 0 --to maxtext --out CASE/maxtext.sh` writes MaxText's form;
3. that script itself runs as `sh maxtext.sh compile`: MaxText 0.2.5's train_compile of the
   exported keys for the same topology, with PYTHON pointing at this file's worker mode, which
   calls train_compile's main in-process and reads the compiled step the way the planner
   reads ours (memory_analysis with the planner's peak rule, the optimized HLO through the
   same roofline for FLOPs);
4. the two are compared: FLOPs within 1%, memory within 5% (the issue's bar).

Needs one interpreter holding MaxText and paxsearch (one jax, one libtpu), as
benchmarks/bench_maxtext_compile.py's docstring sets up:
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/mt312
    /work/mt312/bin/pip install "maxtext[tpu]==0.2.5"
    /work/mt312/bin/pip freeze | grep -E "^(jax|jaxlib|libtpu|flax|optax|orbax-checkpoint|numpy)==" > /tmp/c.txt
    /work/mt312/bin/pip install -c /tmp/c.txt -e .
    /work/mt312/bin/python benchmarks/bench_export_roundtrip.py [--only NAME] [--out DIR]

Results: --out (default runs/bench_export_roundtrip/): CASE/{space.py,run/,maxtext.sh,maxtext.json},
and roundtrip.json with every case's figures; the table is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLOPS_RTOL, MEMORY_RTOL = 0.01, 0.05

# name -> (target, space-file body: the TrainConfig of one trial, no decisions)
_LLAMA = ("vocab_size=4096, d_model=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, d_ff=1536, "
          "seq_len=1024, dtype='bfloat16', param_dtype='float32', mlp='gated', activation='silu', "
          "position='rope', rope_theta=500000.0, attention='flash', scan_layers=True")
_LLAMA_1K = ("vocab_size=32000, d_model=1024, n_layers=8, n_heads=16, n_kv_heads=8, head_dim=64, d_ff=2816, "
             "seq_len=2048, dtype='bfloat16', param_dtype='float32', mlp='gated', activation='silu', "
             "position='rope', attention='flash', scan_layers=True")
CASES = {
    "llama-d1024-fsdp4-full": ("tpu:v5e-4", f"model=ModelConfig({_LLAMA_1K}), mesh=MeshConfig(ici=mesh_shape(fsdp=4)), "
                                            "per_device_batch=2, remat='full'"),
    "llama-fsdp4-full": ("tpu:v5e-4", f"model=ModelConfig({_LLAMA}), mesh=MeshConfig(ici=mesh_shape(fsdp=4)), "
                                      "per_device_batch=4, remat='full'"),
    "llama-fsdp2-tensor2-minimal": (
        "tpu:v5e-4", f"model=ModelConfig({_LLAMA}), mesh=MeshConfig(ici=mesh_shape(fsdp=2, tensor=2), "
                     "rules='sequence_parallel'), per_device_batch=4, remat='minimal'"),
    "parallel-block-fsdp4-custom": (
        "tpu:v5e-4", "model=ModelConfig(vocab_size=4096, d_model=512, n_layers=4, n_heads=8, head_dim=64, "
                     "d_ff=2048, seq_len=1024, dtype='bfloat16', param_dtype='float32', mlp='dense', "
                     "activation='relu', block='parallel', position='rope', tie_embeddings=True, attention='flash'), "
                     "mesh=MeshConfig(ici=mesh_shape(fsdp=4)), per_device_batch=4, "
                     "remat='custom:query_proj=device,key_proj=device,value_proj=device,out_proj=device'"),
}

SPACE = '''"""bench_export_roundtrip case {name}: one planned trial."""
import pyglove as pg

from paxsearch.search.study.configio import to_fiddle
from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, TrainConfig, mesh_shape

STUDY = dict(objectives=["mfu", "memory"], tuner="grid", trials=1, target="{target}", timeout=900)


def space():
    cfg = to_fiddle(TrainConfig({body}, steps=100, eval=EvalConfig(enabled=False)))
    cfg.seed = pg.oneof([0], name="seed")  # a space marks a choice: one point
    return cfg
'''


def worker(out_path: str, argv: list[str]) -> None:
    """Run as the exported script's PYTHON: `-m MODULE base.yml key=value ...`; compile in this
    process with MaxText's train_compile and write the compiled step's figures to out_path."""
    assert argv[0] == "-m", argv
    module, args = argv[1], argv[2:]
    topology = next(a.split("=", 1)[1] for a in args if a.startswith("compile_topology="))
    from paxsearch.search.planning import targets

    target = targets.parse_target(f"tpu:{topology}")
    os.environ.update(targets.target_env(target))
    import jax
    from maxtext.trainers.pre_train import train_compile as tc

    from paxsearch.search.planning import roofline
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.trainer.plan import memory_estimate, optimized_hlo

    assert module == tc.__name__, f"the script runs {module}, expected {tc.__name__}"
    captured: dict = {}
    get_mesh, compile_lowered = tc.get_topology_mesh, jax.stages.Lowered.compile

    def topology_mesh(config):
        captured["mesh"] = get_mesh(config)
        return captured["mesh"]

    def keep(self, *a, **k):
        compiled = compile_lowered(self, *a, **k)
        captured.update(lowered=self, compiled=compiled)
        return compiled

    tc.get_topology_mesh, jax.stages.Lowered.compile = topology_mesh, keep
    res: dict = {"argv": argv, "jax": jax.__version__, "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", "")}
    t0 = time.perf_counter()
    try:
        tc.main(["train_compile", *args])
    except BaseException as e:  # noqa: BLE001  (absl's SystemExit too): recorded
        res.update(error=f"{type(e).__name__}: {str(e).strip()[:500]}", traceback=traceback.format_exc()[-3000:])
    res["compile_s"] = time.perf_counter() - t0
    compiled = captured.get("compiled")
    if compiled is not None and "error" not in res:
        est = memory_estimate(compiled)  # the planner's own reading (trainer/plan.py)
        res.update(peak_bytes=est.peak_bytes, temp_bytes=est.temp_bytes, argument_bytes=est.argument_bytes)
        text, source, why = optimized_hlo(compiled, captured["lowered"])
        res["hlo_source"], res["hlo_error"] = source, why
        if text:
            mesh = captured["mesh"]
            roof = roofline.analyze(text, hardware_for(list(mesh.devices.flat), target.chip), mesh=mesh)
            res["xla_flops_per_step"] = float(roof.flops_per_step)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1, default=str)


def run_case(name: str, out: str, timeout: int) -> dict:
    target, body = CASES[name]
    case = os.path.join(out, name)
    os.makedirs(case, exist_ok=True)
    space = os.path.join(case, "space.py")
    with open(space, "w") as f:
        f.write(SPACE.format(name=name, target=target, body=body))
    run_dir = os.path.join(case, "run")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    py = sys.executable
    res: dict = {"name": name, "target": target, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t0 = time.perf_counter()
    subprocess.run([py, "-m", "paxsearch.search.cli", "run", space, "--run-dir", run_dir, "--no-progress"],
                   cwd=ROOT, stdout=sys.stderr, timeout=timeout)
    res["plan_s"] = time.perf_counter() - t0
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open(os.path.join(run_dir, "study.json")) as f:
        study = optuna.load_study(study_name=json.load(f)["study_name"], storage=f"sqlite:///{run_dir}/study.db")
    attrs = study.get_trials()[0].user_attrs
    plan = attrs.get("plan") or {}
    res["ours"] = {k: plan.get(k) for k in ("peak_bytes", "temp_bytes", "argument_bytes", "xla_flops_per_step",
                                            "model_flops_per_step", "global_batch")}
    res["ours"]["failure"] = attrs.get("failure_kind") and f"{attrs['failure_kind']}: {attrs.get('failure_message')}"
    script = os.path.join(case, "maxtext.sh")
    export = subprocess.run([py, "-m", "paxsearch.search.cli", "export", run_dir, "--trial", "0", "--to", "maxtext",
                             "--out", script], cwd=ROOT, capture_output=True, text=True)
    res["export_stderr"] = export.stderr.strip().splitlines()
    if export.returncode:
        res["theirs"] = {"error": f"export failed: {export.stderr.strip()}"}
        return res
    theirs = os.path.join(case, "maxtext.json")
    wrapper = os.path.join(case, "python")
    with open(wrapper, "w") as f:  # the script's PYTHON: this file's worker in this interpreter
        f.write(f'#!/bin/sh\nexec {py} {os.path.abspath(__file__)} --worker {theirs} "$@"\n')
    os.chmod(wrapper, 0o755)
    import maxtext

    env = {**os.environ, "PYTHON": wrapper, "MAXTEXT_CONFIGS": os.path.join(os.path.dirname(maxtext.__file__),
                                                                             "configs")}
    if os.path.exists(theirs):
        os.remove(theirs)
    t0 = time.perf_counter()
    proc = subprocess.run(["sh", script, "compile"], cwd=case, env=env, stdout=sys.stderr, timeout=timeout)
    res["maxtext_s"] = time.perf_counter() - t0
    if os.path.exists(theirs):
        with open(theirs) as f:
            res["theirs"] = json.load(f)
    else:
        res["theirs"] = {"error": f"the exported script ended ({proc.returncode}) and wrote nothing"}
    o, t = res["ours"], res["theirs"]
    if o.get("xla_flops_per_step") and t.get("xla_flops_per_step"):
        res["flops_ratio"] = t["xla_flops_per_step"] / o["xla_flops_per_step"]
    if o.get("peak_bytes") and t.get("peak_bytes"):
        res["memory_ratio"] = t["peak_bytes"] / o["peak_bytes"]
    res["within"] = bool(abs(res.get("flops_ratio", 9) - 1) <= FLOPS_RTOL
                         and abs(res.get("memory_ratio", 9) - 1) <= MEMORY_RTOL)
    return res


def table(results: list[dict]) -> str:
    mib = 2 ** 20
    lines = ["| case | target | ours: peak MiB / XLA FLOPs per chip | MaxText: peak MiB / XLA FLOPs per chip | "
             "memory MaxText / ours | FLOPs MaxText / ours | within 5% / 1% |", "|---|---|---|---|---|---|---|"]
    for r in results:
        o, t = r.get("ours") or {}, r.get("theirs") or {}

        def side(d):
            if d.get("peak_bytes") is None:
                return f"**{(d.get('failure') or d.get('error') or 'none')[:160]}**"
            return f"{d['peak_bytes'] / mib:.1f} / {d.get('xla_flops_per_step') or 0:.4e}"

        fr, mr = r.get("flops_ratio"), r.get("memory_ratio")
        lines.append(f"| {r['name']} | {r['target']} | {side(o)} | {side(t)} | {mr and f'{mr:.4f}' or '-'} "
                     f"| {fr and f'{fr:.4f}' or '-'} | {'yes' if r.get('within') else '**no**'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=list(CASES), help="a case (repeatable; default all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_export_roundtrip"))
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args(argv)
    try:
        import maxtext  # noqa: F401
    except ImportError:
        raise SystemExit("MaxText is not installed in this interpreter: see this script's docstring") from None
    os.makedirs(args.out, exist_ok=True)
    results = [run_case(name, os.path.abspath(args.out), args.timeout) for name in (args.only or list(CASES))]
    with open(os.path.join(args.out, "roundtrip.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(table(results))
    return 0 if all(r.get("within") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
