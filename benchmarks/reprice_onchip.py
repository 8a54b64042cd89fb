"""Every trained point of the on-chip benchmark priced again, at the v5e entry, at the entries before runs 7 and 6,
and with each op-level figure left out (issue 41: do the figures measured op by op in the chip's profiled steps
bring the plans closer?).

Question: benchmarks/fit_vpu.py measures, op by op in the chip's profiled steps, the VPU cycles of ops without a
matmul and the share of their price the DMAs between HBM and VMEM cost; benchmarks/fit_splash.py the splash
kernels' rates in those steps. Priced with them and the DMAs hidden in the HBM time the ops between their start
and -done leave idle (roofline/dma_overlap.py), together and one left out at a time, how far are the plans of
every trained point from the chip's measured step? (--fit: a fit_vpu record's VPU cycles in place of the
entry's.)
Peer: the chip's measured steps (benchmarks/data/onchip_v5e_run*_measured.json).

    python -m paxsearch.benchmarks.reprice_onchip --plan RUN_DIR [--plan RUN_DIR ...] [--fit FIT.json] \\
        [--cache /tmp/reprice_onchip] [--json FILE]

--plan: the plan studies of spaces/onchip_v5e.py made here (their trials' configs; each trained point's optimized
HLO is planned again through the HLO passes, one child process per point, and kept in --cache). No figure is set
from any point's step time: the op-level figures come from the profiled steps alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def measured_steps() -> dict[str, tuple[str, float]]:
    """{point: (half, measured step seconds)} over every chip record (a later record wins)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(DATA, "onchip_v5e_run*_measured.json"))):
        with open(path) as f:
            for name, rec in json.load(f)["points"].items():
                if rec.get("measured_step_s") and rec.get("chip_outcome", "ok") == "ok":
                    out[name] = (str(rec.get("half")), float(rec["measured_step_s"]))
    return out


# the v5e entry's VPU cycles from run 6 to run 7 (fit over runs 5 and 6's fourteen steps, before transposes were a
# kind of their own: they were priced as movement)
RUN6_VPU_CYCLES = (("trigonometric", 20.15), ("transcendental", 0.816), ("arithmetic", 0.173), ("reduction", 1.06),
                   ("movement", 0.218), ("transpose", 0.218))


def variants(hw, fit: dict | None = None) -> dict:
    """The Hardware each variant prices with: the v5e entry (with --fit, the fit's VPU cycles in place of its own),
    the entry before run 7 (run 6's VPU cycles, the splash kernels at their grid measured alone times one factor per
    kind everywhere), before run 6 (also ops by their bytes, the DMAs at their bytes' price on the stream, no
    factor), and the entry with one figure left out at a time."""
    if fit is not None:
        hw = dataclasses.replace(hw, vpu_cycles=tuple((k, float(c)) for k, c in fit["cycles"].items()))
    out = {"v5e entry": hw,
           "before run 7": dataclasses.replace(hw, vpu_cycles=RUN6_VPU_CYCLES, attention_step_grid=()),
           "before run 6": dataclasses.replace(hw, vpu_cycles=(), dma_overlap=False, attention_in_step=(),
                                               attention_step_grid=()),
           "  without the VPU cycles": dataclasses.replace(hw, vpu_cycles=()),
           "  without the DMA overlap": dataclasses.replace(hw, dma_overlap=False),
           "  without the splash kernels' rates in the steps": dataclasses.replace(hw, attention_step_grid=()),
           "  splash at the grid measured alone": dataclasses.replace(hw, attention_step_grid=(),
                                                                      attention_in_step=())}
    if fit is not None and "dma_share" in fit:
        out["  the DMAs at the measured share instead"] = dataclasses.replace(hw, dma_overlap=False,
                                                                             dma_share=float(fit["dma_share"]))
    return out


def summary(errors: list[float]) -> str:
    e = np.array(errors)
    return f"{len(e)} | {np.mean(np.abs(e)):.2%} | {np.max(np.abs(e)):.1%} | {np.mean(e < 0):.0%}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="append", required=True, help="plan study run folder (repeatable)")
    ap.add_argument("--fit", default=None, help="fit_vpu --json output: its figures in place of the entry's")
    ap.add_argument("--cache", default="/tmp/reprice_onchip", help="folder for the planned HLO")
    ap.add_argument("--json", default=None, help="also write every point's steps here")
    args = ap.parse_args(argv)
    from paxsearch.benchmarks import bench_onchip, calibrate_onchip
    from paxsearch.search.planning import roofline
    from paxsearch.search.planning.predict import hardware_for

    fit = None
    if args.fit:
        with open(args.fit) as f:
            fit = json.load(f)
    measured = measured_steps()
    texts: dict[str, str] = {}
    for plan in args.plan:
        points = [p for p in bench_onchip.collect(plan, []) if p.name in measured and p.name not in texts]
        texts.update(calibrate_onchip._plan_all(points, plan, args.cache))
    missing = sorted(set(measured) - set(texts))
    if missing:
        print(f"reprice_onchip: {len(missing)} trained point(s) in no --plan study: {', '.join(missing[:5])}",
              file=sys.stderr)
        return 2
    found = {label: {n: roofline.analyze(t, hw, num_devices=1).step_time_s for n, t in texts.items()}
             for label, hw in variants(hardware_for([None], "v5e"), fit).items()}
    groups = {"all trained": list(texts),
              "dense, head dim 128": [n for n in texts if n.startswith(("m350", "m500", "m900", "m1500"))],
              "m100 (head dim 64)": [n for n in texts if n.startswith("m100")],
              "int8": [n for n in texts if "int8" in n], "MoE": [n for n in texts if n.startswith("moe")]}
    for half in sorted({h for h, _ in measured.values()}):
        groups[f"half {half}"] = [n for n in texts if measured[n][0] == half]
    print("| set | variant | points | mean | max | predicted faster |")
    print("|---|---|---|---|---|---|")
    for group, names in groups.items():
        for label, steps in found.items():
            print(f"| {group} | {label} | " + summary([steps[n] / measured[n][1] - 1 for n in names]) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"fit": fit, "measured": measured, "steps": found}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
