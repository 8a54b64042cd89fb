"""What makes the planner's v5e step times miss the chip's, and which figure, set from the half "a"
points only, brings them in (issue 41, section 1).

Question: for the points of spaces/onchip_v5e.py trained on the project's v5e chip, which bucket of
the roofline (matmuls, the splash-attention kernels, HBM-bound ops, host transfers) is mispriced, and
what error is left on the held-out half "b" once the splash kernels' rate is set from half "a"?
Peer: the chip itself (its studies, 10 steps a point, the last 7 timed; benchmarks/bench_onchip.py).

    python benchmarks/calibrate_onchip.py --plan /tmp/onchip/plan-052 \\
        --chip sqlite:////work/main/.probe/onchip/onchip-a.db --chip sqlite:////work/main/.probe/onchip/onchip-b.db
    # the chip's run-1 steps as recorded (its study files were not kept):
    python benchmarks/calibrate_onchip.py --plan /tmp/onchip/plan-052 \\
        --measured benchmarks/data/onchip_v5e_run1_measured.json

Found (2026-12-07): the roofline counted two things the chip does not do, and priced the splash kernels at
XLA's matmul rate. TPU's AllocateBuffer custom call (a scan's stacked buffer, given and not written) was
priced at its whole result, and an in-place dynamic-update-slice fusion read its slice of the buffer
before writing it: 11-43 and 3-48 ms a step (search/planning/roofline/cost.py now counts neither). The splash
kernels run at 0.51 of peak at head dim 128 (fit here to half a) and half that at head dim 64.

With --figures measured (2026-12-07, later): the splash kernels at the chip's own per-kernel rates
(trainer/hardware.py V5E_SPLASH_RATES: forward, dK/dV, dQ by block and seq, measured by
benchmarks/chip_figures.py), no figure set from any trained point, so all 19 are held out: 5.2% mean,
13.6% max, 84% predicted faster, against the fit's 3.7% / 12.4% / 53%. At head dim 128 the measured rates
do better (3.0% / 8.8% over 11 points, fit 3.2% / 12.4%); the 5 head-dim-64 points, whose rate is d / 128
of the measured head-dim-128 rates (not measured: an assumption), are 7.8-13.6% fast. The table keeps the fit.

Each trained point's stored config is planned again here through the HLO passes for one v5e chip (a
child process per point, 25-60 s each; the optimized HLO is kept in --cache and reused). Then:
  * buckets: each point's roofline seconds by kind of op (a matmul, a splash kernel, any other op,
    the exposed host transfers), at the table's figures (trainer/hardware.py), beside its measured step;
  * the fit: the one v5e figure set here, the splash kernels' share of peak at head dim 128
    (Hardware.attention_efficiency; a kernel of head dim d < 128 runs at d / 128 of it,
    cost.flop_rate), is the value on a 0.005 grid that gives the half-"a" points the least mean |error|,
    the exposed host transfers of each point held at their value at the table's figures;
  * before / after: before is the plan study's stored prediction (the roofline when it was planned),
    after the roofline now (search/planning/roofline at the table's figures, or with --figures measured at the
    chip's per-kernel splash rates), "fit" the step with every splash kernel at the fit's one share, per
    point and as mean / max |error| over half a, half b (held out: no figure was set from it; with
    --figures measured "after" sets none, so every point is held out) and all, with the side bias (the
    share of points on the side most of them are).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

TARGET = "tpu:v5e-1"
FIT_GRID = tuple(round(0.300 + 0.005 * i, 3) for i in range(125))  # 0.300 .. 0.920


@dataclass
class Priced:
    """One point's roofline at the table's figures, split so that the splash rate can be varied."""

    name: str
    half: str
    measured: float  # the chip's step, s
    before: float | None  # the plan study's stored prediction, s
    fixed_s: float  # the seconds of every op but the splash kernels, and the exposed transfers
    # the splash kernels: (FLOPs, HBM bytes, head dim, executions per step) each
    attention: list[tuple[float, float, int, float]] = field(default_factory=list)
    buckets: dict[str, float] = field(default_factory=dict)  # seconds per kind of op
    after: float | None = None  # analyze at the table's figures, s
    fit: float | None = None  # the step with every splash kernel at the fit's one share of peak, s


def attention_seconds(attention, peak: float, efficiency: float, hbm_rate: float, head_dim: int = 128) -> float:
    """The splash kernels' seconds per step at `efficiency` of `peak` (head dim d < head_dim: d / head_dim
    of it), each kernel max(FLOPs / rate, bytes / hbm_rate), as cost.op_costs prices them."""
    total = 0.0
    for flops, hbm_bytes, d, times in attention:
        rate = peak * efficiency * (min(1.0, d / head_dim) if d else 1.0)
        total += max(flops / rate, hbm_bytes / hbm_rate) * times
    return total


def step_at(p: Priced, efficiency: float, peak: float, hbm_rate: float) -> float:
    return p.fixed_s + attention_seconds(p.attention, peak, efficiency, hbm_rate)


def errors(values: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """predicted / measured - 1 per point."""
    return {n: values[n] / measured[n] - 1 for n in values if values[n] is not None and measured.get(n)}


def summary(errs: list[float]) -> dict:
    """Mean and max |error|, and the side bias: the share of points on the side most of them are."""
    if not errs:
        return dict(n=0, mean=None, max=None, faster=0, slower=0, side=None)
    faster, slower = sum(e < 0 for e in errs), sum(e > 0 for e in errs)
    return dict(n=len(errs), mean=sum(abs(e) for e in errs) / len(errs), max=max(abs(e) for e in errs),
                faster=faster, slower=slower, side=max(faster, slower) / len(errs))


def fit_attention(points: list[Priced], half: str, peak: float, hbm_rate: float, grid=FIT_GRID) -> float:
    """The attention efficiency on `grid` that gives the points of `half` the least mean |error|."""
    mine = [p for p in points if p.half == half and p.attention]

    def cost(e: float) -> float:
        return sum(abs(step_at(p, e, peak, hbm_rate) / p.measured - 1) for p in mine)
    return min(grid, key=cost)


def _fmt(s: dict) -> str:
    if not s["n"]:
        return "no points"
    return (f"{s['n']} points, mean {s['mean']:.1%}, max {s['max']:.1%}; {s['faster']} predicted faster, "
            f"{s['slower']} slower ({s['side']:.0%} on one side)")


# ----------------------------------------------------------------------------- planning and pricing

def child(config_path: str, out_path: str) -> None:
    """Plan one stored config for one v5e chip through the HLO passes (as the plan study did) and
    write its optimized HLO text to `out_path` (its own process: the flag set's LIBTPU_INIT_ARGS are
    read when libtpu loads)."""
    from paxsearch.search.planning.targets import parse_target
    from paxsearch.search.study import configio
    from paxsearch.trainer import flagsets

    cfg = configio.build(configio.load(config_path))
    os.environ.update(flagsets.env_for(cfg.flags, "tpu"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from paxsearch.search.planning import hlo_passes
    from paxsearch.search.planning import topology as topo

    target = parse_target(TARGET)
    devices = topo.topology_devices(target.slice_name, target.num_slices)
    program = hlo_passes.build_plan_program(cfg, devices, target.slice_name, target.num_slices)
    with open(out_path + ".part", "w") as f:
        f.write(program.plan.hlo_text)
    os.replace(out_path + ".part", out_path)


def price(name: str, half: str, measured: float, before: float | None, text: str, hw) -> Priced:
    """One point's buckets and its step at `hw`, and what the fit varies."""
    from paxsearch.search.planning import roofline
    from paxsearch.search.planning.roofline import cost, hlo, model

    module = hlo.parse_module(text)
    graph = hlo.call_graph(module)
    buckets = {"matmul": 0.0, "splash": 0.0, "other": 0.0}
    attention = []
    for comp, ins, mult in model._running_ops(module, graph):
        costs = cost.op_costs(module, comp, ins, hw, estimate=False)
        if costs is None:
            continue
        f, b, seconds, _ = costs
        if cost.splash_matmuls(ins):
            buckets["splash"] += seconds * mult
            attention.append((f, b, cost.splash_head_dim(comp, ins) or 0, mult))
        else:
            buckets["matmul" if cost.uses_mxu(module, ins) else "other"] += seconds * mult
    roof = roofline.analyze(text, hw, num_devices=1)
    buckets["exposed host"] = sum(c.exposed_s for c in roof.collectives if c.link == "host")
    buckets["exposed other"] = roof.exposed_comm_s - buckets["exposed host"]
    fixed = roof.step_time_s - buckets["splash"]
    return Priced(name, half, measured, before, fixed, attention, buckets, roof.step_time_s)


def _plan_all(points, plan_dir: str, cache: str) -> dict[str, str]:
    """{point: its optimized HLO text}, planned here where --cache has none."""
    from paxsearch.analysis.load import load_trials

    frame = load_trials(plan_dir)
    dirs = {str(r["d.point"]): r["trial_dir"] for r in frame.sort_values("number").to_dict("records")}
    os.makedirs(cache, exist_ok=True)
    texts = {}
    for p in points:
        path = os.path.join(cache, p.name + ".hlo")
        if not os.path.exists(path):
            config = os.path.join(dirs[p.name], "config.json")
            print(f"planning {p.name} ...", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, __file__, "--child", config, path], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{p.name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        with open(path) as f:
            texts[p.name] = f.read()
    return texts


def measured_points(plan_dir: str, path: str) -> list:
    """The plan study's points that the record at `path` holds a measured step for, each with it."""
    from paxsearch.benchmarks import bench_onchip

    with open(path) as f:
        record = json.load(f)["points"]
    points = []
    for p in bench_onchip.collect(plan_dir, []):
        r = record.get(p.name)
        if r is not None and r.get("measured_step_s"):
            if str(r.get("half", p.half)) != p.half:
                raise SystemExit(f"{p.name}: half {r.get('half')} in {path}, {p.half} in the plan study")
            points.append(dataclasses.replace(p, measured_step=float(r["measured_step_s"]), chip_outcome="ok"))
    # a point the chip did not train (refused, crashed) has no step to hold a plan against
    missing = sorted({n for n, r in record.items() if r.get("measured_step_s")} - {p.name for p in points})
    if missing:
        raise SystemExit(f"{path}: {len(missing)} point(s) not planned in {plan_dir}: {', '.join(missing[:5])}")
    return points


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", help="run folder of the plan made here (its study and trials/N/config.json)")
    ap.add_argument("--chip", action="append", default=[], help="the chip's study (repeatable)")
    ap.add_argument("--measured", default=None,
                    help="instead of --chip: a JSON record of the chip's trained points, {'points': {name: {'half', "
                         "'measured_step_s'}}} (benchmarks/data/onchip_v5e_run1_measured.json)")
    ap.add_argument("--fit-half", default="a", help="the half the fit's figure is set from (default a)")
    ap.add_argument("--figures", choices=("table", "measured"), default="table",
                    help="what 'after' prices the splash kernels at: the table's (trainer/hardware.py's v5e entry: "
                         "since run 3 the splash grid, V5E_SPLASH_GRID, by batch x K/V heads and head group) or the "
                         "chip's seq-only per-kernel rates (hardware.V5E_SPLASH_RATES, by kernel, block and seq; the "
                         "grid set aside)")
    ap.add_argument("--cache", default="/tmp/calibrate_onchip", help="folder for the planned HLO")
    ap.add_argument("--json", default=None, help="also write the points and the summaries here")
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if not args.plan or not (args.chip or args.measured):
        ap.error("--plan and one of --chip / --measured are required")
    from paxsearch.benchmarks import bench_onchip
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.trainer import hardware

    trained = [p for p in bench_onchip.collect(args.plan, args.chip) if p.measured_step and p.chip_outcome == "ok"]
    if args.measured:
        trained = measured_points(args.plan, args.measured)
    texts = _plan_all(trained, args.plan, args.cache)
    hw = hardware_for([], "v5e")
    if args.figures == "measured":
        hw = dataclasses.replace(hw, attention_grid=(),
                                 attention_rates=hardware.attention_table(hardware.V5E_SPLASH_RATES))
    priced = []
    for p in sorted(trained, key=lambda p: (p.half, p.name)):
        priced.append(price(p.name, p.half, p.measured_step, p.predicted_step, texts[p.name], hw))
        print(f"priced {p.name}", file=sys.stderr, flush=True)
    peak, hbm_rate = hw.peak_flops, hw.sustained_hbm_bandwidth
    fitted = fit_attention(priced, args.fit_half, peak, hbm_rate)
    for p in priced:
        p.fit = step_at(p, fitted, peak, hbm_rate)
    table = hardware.TABLE["v5e"]
    measured_rates = bool(hw.attention_rates)
    print("| point | half | measured ms | before ms | error | after ms | error | matmul | splash | other | "
          "exposed host | at the fit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in priced:
        b = p.buckets
        print(f"| {p.name} | {p.half} | {p.measured * 1e3:.1f} | {p.before * 1e3:.1f} | "
              f"{p.before / p.measured - 1:+.1%} | {p.after * 1e3:.1f} | {p.after / p.measured - 1:+.1%} | "
              f"{b['matmul'] * 1e3:.1f} | {b['splash'] * 1e3:.1f} | {b['other'] * 1e3:.1f} | "
              f"{b['exposed host'] * 1e3:.1f} | {p.fit / p.measured - 1:+.1%} |")
    measured = {p.name: p.measured for p in priced}
    eff = table.attention_efficiency
    result = {"fitted_attention_efficiency": fitted, "table_attention_efficiency": eff.value if eff else None,
              "table_attention_rates": [list(r) for r in hw.attention_rates], "summaries": {}}
    if measured_rates:
        print("\nafter: the splash kernels at the chip's measured rates (trainer/hardware.py V5E_SPLASH_RATES, by "
              "kernel, block and seq; no figure set from any trained point: all of them held out)")
    else:
        print(f"\nafter: the splash kernels at the table's one figure {eff.value if eff else None}")
    print(f"fit: one share of peak for every splash kernel at head dim 128, set from half {args.fit_half}: "
          f"{fitted:.3f}")
    held = "all held out" if measured_rates else "half b held out"
    for label, key in (("before", "before"), (f"after ({held})", "after"), (f"fit to half {args.fit_half}", "fit")):
        errs = errors({p.name: getattr(p, key) for p in priced}, measured)
        for group, names in (("half a", [p.name for p in priced if p.half == "a"]),
                             ("half b", [p.name for p in priced if p.half == "b"]),
                             ("all", [p.name for p in priced])):
            s = summary([errs[n] for n in names if n in errs])
            result["summaries"][f"{key} {group}"] = s
            print(f"{label}, {group}: {_fmt(s)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"points": [p.__dict__ for p in priced], **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
