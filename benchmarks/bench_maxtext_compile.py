"""MaxText's own compiled step beside ours, for the published configs (compile-only, on this CPU).

Question: when a published row misses, is it our trainer's program or the roofline?
Peer: MaxText 0.2.5's own compiled step for the same row, read by the same planner.

For each row of benchmarks/published.py this compiles MaxText's train step for the row's TPU
slice with MaxText's `train_compile` (its AOT entry point, MaxText 0.2.5: the dims, mesh,
per-chip batch, remat and attention of the row, the row's compiler flags), then reads that
compiled program the way the planner reads ours: memory_analysis() for the memory figure,
the optimized HLO through the roofline (search/planning/roofline) for the predicted step time, and
MFU with the same model FLOPs (trainer/flops.py; same dims, so the same count). Our side is
bench_published's plan of the same row, run by the same interpreter (same jax, same libtpu).
So the table separates the two causes of a miss: where MaxText's program and ours differ
(memory, FLOPs, collectives), the trainer differs; where they agree and both miss the
published figure, the roofline is what is off.

Needs an environment holding both trainers with one jax, e.g. (benchmarks/RESULTS.md):
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/mt312
    /work/mt312/bin/pip install "maxtext[tpu]==0.2.5"
    /work/mt312/bin/pip freeze | grep -E "^(jax|jaxlib|libtpu|flax|optax|orbax-checkpoint|numpy)==" > /tmp/c.txt
    /work/mt312/bin/pip install -c /tmp/c.txt -e .
    /work/mt312/bin/python benchmarks/bench_maxtext_compile.py --only "v5p-128 64B"
    /work/mt312/bin/python benchmarks/bench_maxtext_compile.py --report

Mixtures of experts (issue 43 section 4): `--moe --only "v5p-128 Mixtral-8x7B"` does the same for a
row of published.MOE_ROWS, MaxText given the row's MoE keys (moe_maxtext_argv: decoder_block mixtral,
SwiGLU, num_experts, num_experts_per_tok, base_moe_mlp_dim, capacity_factor -1 = dropless, sparse_matmul,
megablox, load_balance_loss_weight, ici_expert_parallelism) and ours planned by bench_published's MoE
space with the whole compile (--plan-compile full); results in --out/moe/. `--maxtext-gmm ragged_dot`
(default) gives MaxText's dropless experts jax.lax.ragged_dot, as ours (megablox=false); `megablox` its
Pallas kernel, as the published run had it.

Results: --out (default runs/bench_maxtext_compile/): <row>.maxtext.json per row, and ours in
--out/ours/ (bench_published's files). Rows already there are re-used unless --fresh.
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
from paxsearch.benchmarks import bench_published, published

GiB = 2 ** 30
DEFAULT_OUT = os.path.join(ROOT, "runs", "bench_maxtext_compile")


def model_of(row: published.Published, layers: int | None = None):
    """The row's ModelConfig (its preset), with `layers` decoder layers when given."""
    from paxsearch.trainer import presets

    return presets.replace(row.preset, n_layers=layers) if layers else presets.get(row.preset)


def maxtext_argv(row: published.Published, base_yml: str, layers: int | None = None) -> list[str]:
    """MaxText 0.2.5 config overrides that build the row's model, mesh, batch and remat."""
    d, f, t = row.ici
    dcn = [f"dcn_data_parallelism={row.slices}"] if row.slices > 1 else []  # the rows' data parallelism over DCN
    return maxtext_common_argv(base_yml, row.target, model_of(row, layers), row.maxtext_per_device_batch,
                               row.remat, published.ATTENTION[row.attention]) + [
        f"ici_data_parallelism={d}", f"ici_fsdp_parallelism={f}", f"ici_tensor_parallelism={t}", *dcn]


def maxtext_common_argv(base_yml: str, target: str, m, per_device_batch: int, remat: str, attention: str) -> list[str]:
    """The overrides every comparison shares: the model's dims, the slice, the batch, remat and
    attention, bf16 activations over fp32 weights, AdamW, synthetic data; the mesh is the caller's."""
    from paxsearch.search.planning.targets import parse_target
    from paxsearch.search.planning.topology import parse_slice

    t = parse_target(target)
    tpu_slice = parse_slice(t.slice_name or "")
    # MaxText's train_compile knows a slice by its name, in its usual topology only; a row planned on
    # another topology (v5p-1024@4x8x16) is compiled by MaxText on the usual one with split axes
    split = ["allow_split_physical_axes=true"] if tpu_slice.chosen_topology else []
    return [
        "train_compile", base_yml, "run_name=peer", f"compile_topology={tpu_slice.base_name}", *split,
        f"compile_topology_num_slices={t.num_slices}", "decoder_block=default", f"base_emb_dim={m.d_model}",
        f"base_num_query_heads={m.n_heads}", f"base_num_kv_heads={m.n_kv_heads or m.n_heads}",
        f"head_dim={m.head_dim}", f"base_mlp_dim={m.d_ff}", f"base_num_decoder_layers={m.n_layers}",
        f"mlp_activations=[\"{m.activation}\"]", f"logits_via_embedding={str(m.tie_embeddings).lower()}",
        f"vocab_size={m.vocab_size}", f"max_target_length={m.seq_len}",
        f"per_device_batch_size={per_device_batch}",
        # MaxText 0.2.5 keeps the 2023 remat names ("minimal" saves every projection and MLP dot);
        # its attention names are ours (published.ATTENTION: flash, or plain attention = dot_product)
        f"remat_policy={remat}", f"attention={attention}", "dtype=bfloat16",
        "weight_dtype=float32", "enable_dropout=false", "dataset_type=synthetic", "enable_checkpointing=false",
        "opt_type=adamw", "skip_jax_distributed_system=true",
    ]


def moe_maxtext_argv(row: published.MoePublished, base_yml: str, gmm: str = "ragged_dot") -> list[str]:
    """MaxText 0.2.5 overrides (configs/base.yml keys) for a MoE row: the common ones with the Mixtral block
    (decoder_block mixtral: RMSNorm pre-norm, SwiGLU experts, softmax top-k router renormalized), then the
    experts, the expert compute and the row's mesh by axis name (our expert axis is MaxText's).
    load_balance_loss_weight is ours / experts_per_token, the convention of search/export/maxtext.py's writer and
    trainer/maxtext_yml.py's reader (MaxText's loss counts each of a token's k routes: k x ours unweighted)."""
    from paxsearch.search.export.maxtext import per_route_weight

    m = published.moe_model(row)
    if m.n_shared_experts or m.first_dense_layers or m.moe_every != 1 or m.router != "softmax" or m.mlp != "gated":
        raise ValueError(f"{row.name}: the mixtral block holds no shared expert, leading dense layer, interleave, "
                         "sigmoid router or non-gated expert")
    common = maxtext_common_argv(base_yml, row.target, m, row.maxtext_per_device_batch, "full", "flash")
    common = [a for a in common if not a.startswith(("decoder_block=", "mlp_activations=", "remat_policy=",
                                                     "weight_dtype="))]
    dropless = m.expert_compute == "dropless"
    mesh = [f"ici_{axis}_parallelism={size}" for axis, size in row.mesh]
    if row.remat != "full":
        raise ValueError(f"{row.name}: remat {row.remat!r} has no MaxText mapping here (full only)")
    k = m.experts_per_token
    return common + [
        "decoder_block=mixtral", f"mlp_activations=[\"{m.activation}\",\"linear\"]", "remat_policy=full",
        f"weight_dtype={m.param_dtype}", f"rope_max_timescale={int(m.rope_theta)}",
        f"num_experts={m.n_experts}", f"num_experts_per_tok={k}", f"base_moe_mlp_dim={m.expert_d_ff or m.d_ff}",
        f"load_balance_loss_weight={per_route_weight(m.load_balance_weight, k)}",
        f"capacity_factor={-1.0 if dropless else m.capacity_factor}", f"sparse_matmul={str(dropless).lower()}",
        f"megablox={str(dropless and gmm == 'megablox').lower()}", *mesh, *(MOE_TILES if dropless else [])]


# MaxText's grouped-matmul tiles (base.yml wi_tile_* / wo_tile_*, given to jax.lax.ragged_dot as its tiling): at its
# default (512, 1024, 1024) the v5p compiler runs out of scoped VMEM in the backward ragged dot of Mixtral 8x7B
# ("16.41M and limit 16.00M": the published run raised the limit to 80 MiB, a flag our row's flag set does not
# hold); the mlp tile halved fits the default limit. Ours gives the compiler no tiling.
MOE_TILES = [f"{w}_tile_{p}_mlp_dim=512" for w in ("wi", "wo") for p in ("fwd", "dlhs", "drhs")]


def compile_maxtext(row: published.Published, out_path: str, layers: int | None = None) -> None:
    """In this (fresh) process: compile MaxText's step for the row; write the figures to out_path."""
    compile_maxtext_step(row.name, row.target, row.flags, lambda base_yml: maxtext_argv(row, base_yml, layers),
                         model_of(row, layers), row.global_batch, out_path)


def compile_maxtext_step(name: str, target_name: str, flags: str, argv_for, model, global_batch: int,
                         out_path: str) -> None:
    """In this (fresh) process: compile MaxText's step (`argv_for(base_yml)`, train_compile's
    argv) for target `target_name` with our flag set `flags`; read it as the planner reads ours
    (memory_analysis, the optimized HLO through the roofline, MFU with our model FLOPs of
    `model` at `global_batch`); write the figures to out_path."""
    from paxsearch.search.planning import targets, topology
    from paxsearch.trainer import flagsets

    target = targets.parse_target(target_name)
    os.environ.update(targets.target_env(target))
    os.environ.update(flagsets.env_for(flags, "tpu"))
    import jax
    import maxtext
    from maxtext.trainers.pre_train import train_compile as tc

    from paxsearch.search.planning import roofline
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.trainer import flops as flops_lib
    from paxsearch.trainer.plan import memory_estimate, optimized_hlo

    captured: dict = {}
    get_mesh = tc.get_topology_mesh

    def topology_mesh(config):
        captured["mesh"] = get_mesh(config)
        return captured["mesh"]

    compile_lowered = jax.stages.Lowered.compile

    def keep(self, *a, **k):  # the step's Lowered and Compiled, for the HLO fallback of plan.optimized_hlo
        compiled = compile_lowered(self, *a, **k)
        captured.update(lowered=self, compiled=compiled)
        return compiled

    tc.get_topology_mesh, jax.stages.Lowered.compile = topology_mesh, keep
    argv = argv_for(os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml"))
    res = {"name": name, "argv": argv, "jax": jax.__version__, "flags": flags,
           "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t0 = time.perf_counter()
    try:
        tc.main(argv)
    except BaseException as e:  # noqa: BLE001  (SystemExit from absl included): recorded, not raised
        oom = topology.predicted_oom_from(e, target.hbm_bytes_per_device)
        res.update(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                   predicted_oom=str(oom) if oom else None, traceback=traceback.format_exc()[-3000:])
    res["compile_s"] = time.perf_counter() - t0
    compiled = captured.get("compiled")
    if compiled is not None and "error" not in res:
        est = memory_estimate(compiled)  # the planner's own reading (trainer/plan.py)
        mem = dict(argument=est.argument_bytes, output=est.output_bytes, temp=est.temp_bytes, alias=est.alias_bytes,
                   code=est.generated_code_bytes)
        peak = est.peak_bytes  # the planner's own rule (donated inputs alias outputs: counted once)
        res.update(memory=mem, peak_bytes=peak, hbm_bytes=target.hbm_bytes_per_device,
                   fits=peak <= target.hbm_bytes_per_device)
        text, source, why = optimized_hlo(compiled, captured["lowered"])
        res["hlo_source"], res["hlo_error"] = source, why
        if text:
            with open(out_path.replace(".json", ".hlo.txt"), "w") as f:
                f.write(text)
            mesh = captured["mesh"]
            hw = hardware_for(list(mesh.devices.flat), target.chip)
            roof = roofline.analyze(text, hw, mesh=mesh)
            model_flops = flops_lib.model_flops_per_step(model, global_batch)
            res.update(roofline=roof.to_dict(), model_flops_per_step=model_flops,
                       predicted_step_time=roof.step_time_s,
                       predicted_mfu=roof.predicted_mfu(model_flops, mesh.devices.size, hw.peak_flops))
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1, default=str)


def run_maxtext(row: published.Published, out: str, timeout: int, layers: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--maxtext-row", row.name, "--out", out]
    cmd += ["--layers", str(layers)] if layers else []
    path = os.path.join(out, bench_published.slug(row.name) + ".maxtext.json")
    return run_compile_child(row.name, "MaxText", cmd, path, out, timeout)


def run_compile_child(name: str, label: str, cmd: list[str], path: str, out: str, timeout: int) -> dict:
    """Run one compile in its own process (`cmd`, in folder `out`: MaxText writes maxtext_output/
    there); the JSON it wrote to `path`, or an error record in its place when it wrote nothing."""
    print(f"[{name}] {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        rc: int | str = subprocess.run(cmd, cwd=out, stdout=sys.stderr, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"name": name, "error": f"the {label} compile process ended ({rc}) and wrote nothing"}, f)
    with open(path) as f:
        return json.load(f)


def run_moe(row: published.MoePublished, out: str, timeout: int, gmm: str) -> dict:
    cmd = [sys.executable, __file__, "--moe", "--maxtext-row", row.name, "--out", out, "--maxtext-gmm", gmm]
    path = os.path.join(out, bench_published.slug(row.name) + ".maxtext.json")
    return run_compile_child(row.name, "MaxText", cmd, path, out, timeout)


def moe_report(rows, ours: dict, theirs: dict) -> str:
    """The MoE rows: both sides' peak, temporaries, executed FLOPs and predicted step, and the ratios
    (the issue's goal: FLOPs within 1%, memory within 5%)."""
    from paxsearch.store.plan import Plan

    lines = ["| config | side | peak / HBM GiB | temp GiB | argument GiB | XLA FLOPs / chip | predicted step s | "
             "predicted MFU |", "|---|---|---|---|---|---|---|---|"]
    ratios = ["| config | peak ours / MaxText | temp ours / MaxText | FLOPs ours / MaxText | step ours / MaxText |",
              "|---|---|---|---|---|"]
    for r in rows:
        o, m = ours.get(r.name) or {}, theirs.get(r.name) or {}
        plan = Plan.from_stored(o.get("plan")) or Plan()
        fig = {}
        for side, res in (("paxsearch", o), ("MaxText 0.2.5", m)):
            if side == "paxsearch":
                fail = o.get("failure_kind") and f"{o['failure_kind']}: {(o.get('failure_message') or '')[:160]}"
                f = dict(peak=plan.peak_bytes, hbm=plan.hbm_bytes, temp=plan.temp_bytes, args=plan.argument_bytes,
                         roof=plan.roofline or {}, mfu=plan.predicted_mfu)
            else:
                fail = m.get("error") and (m.get("predicted_oom") or m["error"])[:200]
                f = dict(peak=m.get("peak_bytes"), hbm=m.get("hbm_bytes"), temp=(m.get("memory") or {}).get("temp"),
                         args=(m.get("memory") or {}).get("argument"), roof=m.get("roofline") or {},
                         mfu=m.get("predicted_mfu"))
            if not res or (fail and f["peak"] is None):
                lines.append(f"| {r.name} | {side} | **{fail or 'not compiled'}** | | | | | |")
                continue
            fig[side] = f
            lines.append(f"| {r.name} | {side} | {_gib(f['peak'])} / {_gib(f['hbm'])} | {_gib(f['temp'])} "
                         f"| {_gib(f['args'])} | {_f(f['roof'].get('flops_per_step'), '.4e')} "
                         f"| {_f(f['roof'].get('step_time_s'), '.3f')} | {_f(f['mfu'], '.2%')} |")
        if len(fig) == 2:
            a, b = fig["paxsearch"], fig["MaxText 0.2.5"]
            q = lambda x, y: "-" if not x or not y else f"{x / y:.4f}"  # noqa: E731
            ratios.append(f"| {r.name} | {q(a['peak'], b['peak'])} | {q(a['temp'], b['temp'])} "
                          f"| {q(a['roof'].get('flops_per_step'), b['roof'].get('flops_per_step'))} "
                          f"| {q(a['roof'].get('step_time_s'), b['roof'].get('step_time_s'))} |")
    return "\n".join(lines) + "\n\n" + "\n".join(ratios)


def moe_main(args) -> int:
    """--moe: the MoE rows (published.MOE_ROWS that are planned), MaxText's compile and our plan."""
    unknown = [n for n in args.only if n not in published.MOE_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown MoE row(s) {unknown}; rows: {', '.join(published.MOE_BY_NAME)}")
    rows = [published.MOE_BY_NAME[n] for n in args.only] if args.only else [r for r in published.MOE_ROWS
                                                                              if r.planned]
    if any(not r.planned for r in rows):
        raise SystemExit(f"not expressible here: {', '.join(r.name for r in rows if not r.planned)}")
    out = os.path.join(args.out, "moe") if args.out == DEFAULT_OUT else args.out
    ours_dir = os.path.join(out, "ours")
    os.makedirs(ours_dir, exist_ok=True)
    ours, theirs = {}, {}
    for r in rows:
        path = os.path.join(out, bench_published.slug(r.name) + ".maxtext.json")
        if os.path.exists(path) and not args.fresh:
            with open(path) as f:
                theirs[r.name] = json.load(f)
        elif not args.report and args.side in ("both", "maxtext"):
            theirs[r.name] = run_moe(r, out, args.timeout, args.maxtext_gmm)
        res = None if args.fresh else bench_published.load_result(r, ours_dir)
        if res is None and not args.report and args.side in ("both", "paxsearch"):
            res = bench_published.plan_row(r, ours_dir, args.timeout, text=bench_published.moe_space_text(
                r, args.timeout), extra_args=["--plan-compile", "full"])
        if res is not None:
            ours[r.name] = res
    print(moe_report(rows, ours, theirs), flush=True)
    return 0


def _gib(x):
    return "-" if x is None else f"{x / GiB:.1f}"


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def report(rows, ours: dict, theirs: dict) -> str:
    from paxsearch.store.plan import Plan

    lines = ["| config | side | fits (peak / HBM GiB) | temp GiB | XLA FLOPs / chip | HBM bytes / chip | predicted "
             "step s | predicted MFU | / published | compute s | memory s | comm s | exposed comm s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pub = published.converted_mfu(r)
        o = ours.get(r.name) or {}
        plan = Plan.from_stored(o.get("plan")) or Plan()  # the result file holds the stored plan
        m = theirs.get(r.name) or {}
        for side, peak, hbm, temp, roof, mfu, fail in (
                ("paxsearch", plan.peak_bytes, plan.hbm_bytes, plan.temp_bytes,
                 plan.roofline or {}, plan.predicted_mfu,
                 o.get("failure_kind") and f"{o.get('failure_kind')}: {(o.get('failure_message') or '')[:160]}"),
                ("MaxText 0.2.5", m.get("peak_bytes"), m.get("hbm_bytes"), (m.get("memory") or {}).get("temp"),
                 m.get("roofline") or {}, m.get("predicted_mfu"),
                 m.get("error") and ((m.get("predicted_oom") or m["error"])[:200]))):
            fits = "-" if peak is None else ("fits" if peak <= (hbm or float("inf")) else "**no**")
            if fail and peak is None:
                fits = f"**{fail}**"
            lines.append(
                f"| {r.name} | {side} | {fits} ({_gib(peak)} / {_gib(hbm)}) | {_gib(temp)} "
                f"| {_f(roof.get('flops_per_step'), '.3e')} | {_f(roof.get('hbm_bytes_per_step'), '.3e')} "
                f"| {_f(roof.get('step_time_s'), '.2f')} | {_f(mfu, '.2%')} | {_f(mfu / pub if mfu else None, '.2f')} "
                f"| {_f(roof.get('compute_s'), '.2f')} | {_f(roof.get('memory_s'), '.2f')} "
                f"| {_f(roof.get('comm_s'), '.2f')} | {_f(roof.get('exposed_comm_s'), '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_published.add_row_args(ap, DEFAULT_OUT)
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts rows (published.py MOE_ROWS)")
    ap.add_argument("--maxtext-gmm", choices=("ragged_dot", "megablox"), default="ragged_dot",
                    help="--moe, dropless rows: MaxText's grouped matmul (ragged_dot: as ours; megablox: its kernel)")
    ap.add_argument("--side", choices=("both", "maxtext", "paxsearch"), default="both")
    ap.add_argument("--layers", type=int, help="decoder layers on both sides (a diagnostic: per-layer "
                    "and fixed memory from two depths); results go to --out/layers<N>/ by default")
    ap.add_argument("--maxtext-row", help=argparse.SUPPRESS)  # the worker: one MaxText compile in this process
    args = ap.parse_args(argv)
    if args.moe and args.maxtext_row:
        row = published.MOE_BY_NAME[args.maxtext_row]
        compile_maxtext_step(row.name, row.target, row.flags, lambda yml: moe_maxtext_argv(row, yml, args.maxtext_gmm),
                             published.moe_model(row), row.global_batch,
                             os.path.join(args.out, bench_published.slug(row.name) + ".maxtext.json"))
        return 0
    if args.moe:
        if args.layers:
            ap.error("--layers is for the dense rows")
        try:
            import maxtext  # noqa: F401
        except ImportError:
            raise SystemExit("MaxText is not installed in this interpreter: see this script's docstring") from None
        return moe_main(args)
    if args.maxtext_row:
        compile_maxtext(published.BY_NAME[args.maxtext_row],
                        os.path.join(args.out, bench_published.slug(args.maxtext_row) + ".maxtext.json"), args.layers)
        return 0
    if args.layers and args.out == ap.get_default("out"):
        args.out = os.path.join(args.out, f"layers{args.layers}")
    rows = bench_published.selected_rows(args.only)
    try:
        import maxtext  # noqa: F401
    except ImportError:
        raise SystemExit("MaxText is not installed in this interpreter: see this script's docstring") from None
    os.makedirs(args.out, exist_ok=True)
    ours_dir = os.path.join(args.out, "ours")
    os.makedirs(ours_dir, exist_ok=True)
    ours, theirs = {}, {}
    for r in rows:
        path = os.path.join(args.out, bench_published.slug(r.name) + ".maxtext.json")
        if os.path.exists(path) and not args.fresh:
            with open(path) as f:
                theirs[r.name] = json.load(f)
        elif not args.report and args.side in ("both", "maxtext"):
            theirs[r.name] = run_maxtext(r, args.out, args.timeout, args.layers)
        res = None if args.fresh else bench_published.load_result(r, ours_dir)
        if res is None and not args.report and args.side in ("both", "paxsearch"):
            res = bench_published.plan_row(r, ours_dir, args.timeout,
                                           {"n_layers": args.layers} if args.layers else None)
        if res is not None:
            ours[r.name] = res
        print(report(rows, ours, theirs), "", sep="\n", flush=True)
    if args.layers:
        print(f"(--layers {args.layers}: a diagnostic; '/ published' compares a {args.layers}-layer step with a "
              "full-depth measurement and means nothing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
