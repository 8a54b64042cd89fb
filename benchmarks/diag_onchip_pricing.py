"""Price each published row's fully compiled step three ways (issue 20, section 2): the roofline;
relayouts (transposes, copies into another layout, alone or in a fusion) at the TPU compiler's
own estimate; every op without a matmul at it (Hardware.on_chip "compiler"). One full compile per
row (the compiler's `estimated_cycles` exist only after code generation), the three pricings on
the same HLO. Prints predicted / published MFU per pricing and the ops the estimates add most to.

    python benchmarks/diag_onchip_pricing.py                          # every row, the table's HBM efficiency
    python benchmarks/diag_onchip_pricing.py --hbm-efficiency 1       # as RESULTS.md's table (before it)
    python benchmarks/diag_onchip_pricing.py --only "v5e-256 16B" --top 10

Each row compiles in a fresh process (its flag set's LIBTPU_INIT_ARGS), 1-5 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import published as P  # noqa: E402

PRICINGS = ("roofline", "relayouts", "compiler")


def _layout(shape: str) -> str | None:
    m = re.search(r"\{([\d,]*)", shape)
    return m.group(1) if m else None


def is_relayout(module, comp, ins, depth: int = 0) -> bool:
    """A transpose, or a copy whose operand's layout differs from its result's, alone or in a fusion."""
    from paxsearch.search.planning.roofline import hlo

    if ins.opcode == "transpose":
        return True
    if ins.opcode == "copy":
        return bool(ins.operands) and _layout(hlo.operand_shape(comp, ins.operands[0])) != _layout(ins.shape)
    if ins.opcode == "fusion" and depth < 4:
        called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
        return called is not None and any(is_relayout(module, called, i, depth + 1) for i in called.instrs)
    return False


def price(text: str, hw, mesh, num_devices: int, pricing: str) -> float:
    """The step time of one compiled HLO under `pricing`."""
    from paxsearch.search.planning.roofline import cost, hlo, model

    if pricing == "roofline":
        return model.analyze(text, hw, mesh=mesh, num_devices=num_devices).step_time_s
    compiler_hw = dataclasses.replace(hw, on_chip="compiler")
    if pricing == "compiler":
        return model.analyze(text, compiler_hw, mesh=mesh, num_devices=num_devices).step_time_s
    module = hlo.parse_module(text)
    relayouts = {ins.name for comp in module.computations.values() for ins in comp.instrs
                 if is_relayout(module, comp, ins)}
    original = cost.compiler_estimate

    def only_relayouts(module_, ins, hw_):
        return original(module_, ins, hw_) if ins.name in relayouts else None

    cost.compiler_estimate = only_relayouts  # op_costs looks it up at call time
    try:
        return model.analyze(text, compiler_hw, mesh=mesh, num_devices=num_devices).step_time_s
    finally:
        cost.compiler_estimate = original


def top_ops(text: str, hw, top: int) -> list[str]:
    """The ops whose compiler estimate exceeds their roofline price the most, per step."""
    from paxsearch.search.planning.roofline import cost, hlo, model

    module = hlo.parse_module(text)
    rows = []
    for comp, ins, mult in model._running_ops(module, hlo.call_graph(module)):
        costs = cost.op_costs(module, comp, ins, hw)
        if costs and costs[3] is not None:
            rows.append(((costs[3] - costs[2]) * mult, costs[3] * mult, costs[2] * mult, ins,
                         is_relayout(module, comp, ins)))
    rows.sort(key=lambda r: -r[0])
    return [f"  +{r[0]:.3f} s (estimate {r[1]:.3f} s, roofline {r[2]:.3f} s) {r[3].opcode} {r[3].name} "
            f"{r[3].shape[:60]}{' relayout' if r[4] else ''}" for r in rows[:top]]


def one_row(name: str, hbm_efficiency: float | None, top: int, out_dir: str) -> dict:
    """Compile one row in full (this process) and price it three ways."""
    import fiddle as fdl

    import bench_published as B
    from paxsearch.search.planning import predict, topology
    from paxsearch.search.study.space import load_space
    from paxsearch.trainer import flagsets, plan

    row = P.BY_NAME[name]
    slice_name = row.target.split(":", 1)[1]
    os.environ.update(flagsets.env_for(row.flags, "tpu"))
    os.environ.update(topology.compile_only_env(topology.parse_slice(slice_name)))
    folder = os.path.join(out_dir, B.slug(name))
    os.makedirs(folder, exist_ok=True)
    space = os.path.join(folder, "space.py")
    with open(space, "w") as f:
        f.write(B.space_text(row, 3600))
    cfg = fdl.build(load_space(space).first_config())
    devices = topology.topology_devices(slice_name)
    program = plan.build_program(cfg, devices, count_flops=False, keep_hlo=True)
    hw = predict.hardware_for(devices, slice_name.split("-")[0])
    if hbm_efficiency is not None:
        hw = dataclasses.replace(hw, hbm_efficiency=hbm_efficiency)
    text = program.plan.hlo_text
    per_chip = program.plan.model_flops_per_step / program.plan.num_devices
    out = {"row": name, "held_out": row.held_out, "published_mfu": P.converted_mfu(row),
           "hbm_efficiency": hw.hbm_efficiency, "top": top_ops(text, hw, top)}
    for pricing in PRICINGS:
        step = price(text, hw, program.mesh, program.plan.num_devices, pricing)
        out[pricing] = {"step_s": step, "ratio": per_chip / step / hw.peak_flops / out["published_mfu"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="a row's name (repeatable; default: every row)")
    ap.add_argument("--hbm-efficiency", type=float, default=None,
                    help="price HBM bytes at this share of the bandwidth (default: trainer/hardware.py's)")
    ap.add_argument("--top", type=int, default=5, help="ops listed per row")
    ap.add_argument("--out", default="runs/diag_onchip_pricing", help="folder for each row's space and result")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # internal: compile this one row in this process
    args = ap.parse_args(argv)
    if args.row:
        print(json.dumps(one_row(args.row, args.hbm_efficiency, args.top, args.out)))
        return 0
    names = args.only or [r.name for r in P.ROWS]
    unknown = [n for n in names if n not in P.BY_NAME]
    if unknown:
        print(f"diag_onchip_pricing: error: unknown row {unknown[0]!r}; rows: {', '.join(P.BY_NAME)}", file=sys.stderr)
        return 2
    results = []
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--row", name, "--top", str(args.top), "--out", args.out]
        if args.hbm_efficiency is not None:
            cmd += ["--hbm-efficiency", str(args.hbm_efficiency)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if proc.returncode != 0:
            print(f"[{name}] failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
            continue
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(result)
        print(f"[{name}] " + ", ".join(f"{p} {result[p]['ratio']:.3f}" for p in PRICINGS), flush=True)
        print("\n".join(result["top"]), flush=True)
    print("\n| row | " + " | ".join(PRICINGS) + " |\n|---|" + "---|" * len(PRICINGS))
    for r in results:
        print(f"| {r['row']}{' (held out)' if r['held_out'] else ''} | "
              + " | ".join(f"{r[p]['ratio']:.3f}" for p in PRICINGS) + " |")
    for held in (False, True):
        group = [r for r in results if r["held_out"] == held]
        if group:
            print(("held out" if held else "calibration") + ": mean |error| " + ", ".join(
                f"{p} {100 * sum(abs(r[p]['ratio'] - 1) for r in group) / len(group):.1f}%" for p in PRICINGS))
    return 0 if len(results) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
