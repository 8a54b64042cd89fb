"""How far to trust a plan made here for one TPU v5e chip: each point of spaces/onchip_v5e.py
planned on this machine and trained on the chip, side by side (issue 41, section 1).

Question: for the same config, how close is the plan's step time to the step the chip ran, do
the plan's and the chip's fit verdicts agree, and how far apart are compiled and measured memory?
Peer: the chip itself (10 steps a point, the last 7 timed; `paxsearch run` there).

    # here: the plan (libtpu of the `tpu` extra; prefix PYTHONPATH=<libtpu-0.0.42.1 dir> for the chip's)
    paxsearch run spaces/onchip_v5e.py --run-dir runs/onchip-plan
    # on the chip's machine (two halves, each one 10-minute command)
    paxsearch run spaces/onchip_v5e.py --set half=a --run-dir runs/onchip-a
    paxsearch run spaces/onchip_v5e.py --set half=b --run-dir runs/onchip-b
    # the table and the summary
    python benchmarks/bench_onchip.py --plan runs/onchip-plan --chip runs/onchip-a --chip runs/onchip-b

Per point: the plan's predicted step and the chip's measured step (error = predicted / measured
- 1; negative: the plan said faster), the step the chip's own compile predicts (the same roofline
over the chip compiler's HLO: how much of the error is the compiler's), the plan's compiled
memory, the chip's compiled and measured peak, and both fit verdicts. The summary gives mean and
max |error| over all trained points and over the held-out half ("b"), how many points the plan
called faster and slower, and the verdicts' agreement.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

GIB = 2**30
OUT_OF_MEMORY = ("predicted_oom", "runtime_oom")


@dataclass(frozen=True)
class Point:
    name: str
    half: str
    plan_outcome: str  # "ok" or a failure kind
    chip_outcome: str | None  # None: not run on the chip
    predicted_step: float | None  # the plan's (made here)
    chip_predicted_step: float | None  # the roofline over the chip compiler's HLO
    measured_step: float | None
    plan_bytes: float | None
    chip_bytes: float | None  # the chip compiler's peak
    measured_bytes: float | None  # the chip's memory_stats peak (buffers + program temporaries)
    plan_libtpu: str | None
    chip_libtpu: str | None

    @property
    def plan_fits(self) -> bool | None:
        return _fits(self.plan_outcome)

    @property
    def chip_fits(self) -> bool | None:
        return _fits(self.chip_outcome)

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 of the plan made here."""
        return _ratio_error(self.predicted_step, self.measured_step)

    @property
    def chip_error(self) -> float | None:
        return _ratio_error(self.chip_predicted_step, self.measured_step)

    @property
    def memory_error(self) -> float | None:
        """measured / the chip's compiled peak - 1."""
        return _ratio_error(self.measured_bytes, self.chip_bytes)


def _fits(outcome: str | None) -> bool | None:
    """Whether a trial's outcome says the config fits the chip; None where it says neither
    (not run, or failed for a reason other than memory)."""
    if outcome is None:
        return None
    if outcome == "ok":
        return True
    return False if outcome in OUT_OF_MEMORY else None


def _ratio_error(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b - 1.0


@dataclass(frozen=True)
class Summary:
    trained: int
    mean_abs_error: float | None
    max_abs_error: float | None
    held_out: int
    held_out_mean_abs_error: float | None
    held_out_max_abs_error: float | None
    predicted_faster: int
    predicted_slower: int
    chip_compile_mean_abs_error: float | None
    chip_compile_max_abs_error: float | None
    verdicts_compared: int
    verdicts_agree: int
    memory_compared: int
    memory_mean_abs_error: float | None
    memory_max_abs_error: float | None


def _mean_max(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return sum(abs(v) for v in values) / len(values), max(abs(v) for v in values)


def summarize(points: list[Point], held_out_half: str = "b") -> Summary:
    """held_out_half: the held-out half, or several comma-separated ("b,c")."""
    halves = {h.strip() for h in held_out_half.split(",")}
    errors = [p.error for p in points if p.error is not None]
    held = [p.error for p in points if p.error is not None and p.half in halves]
    chip = [p.chip_error for p in points if p.chip_error is not None]
    mem = [p.memory_error for p in points if p.memory_error is not None]
    verdicts = [(p.plan_fits, p.chip_fits) for p in points if p.plan_fits is not None and p.chip_fits is not None]
    return Summary(len(errors), *_mean_max(errors), len(held), *_mean_max(held),
                   sum(1 for e in errors if e < 0), sum(1 for e in errors if e > 0), *_mean_max(chip),
                   len(verdicts), sum(1 for a, b in verdicts if a == b), len(mem), *_mean_max(mem))


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _rows(source: str) -> dict[str, dict]:
    """{point name: its trial's row} of a stored study (the newest trial of each point)."""
    from paxsearch.analysis.load import load_trials

    frame = load_trials(source)
    rows: dict[str, dict] = {}
    for row in frame.sort_values("number").to_dict("records"):
        if row.get("d.point"):
            rows[str(row["d.point"])] = row
    return rows


# A chip record (--measured, --export): per point what the chip's study stored, in the keys of the
# rows above, so that a run's measurements outlive its study file (benchmarks/data/onchip_v5e_run*.json).
_RECORD_KEYS = {"chip_outcome": "outcome", "measured_step_s": "step_time",
                "chip_predicted_step_s": "plan.predicted_step_time", "chip_peak_bytes": "plan.peak_bytes",
                "measured_peak_bytes": "measured_peak_bytes", "chip_libtpu": "env.libtpu"}


def read_record(path: str) -> dict[str, dict]:
    """{point: row} from a chip record; a record may hold only half, chip_outcome and measured_step_s."""
    with open(path) as f:
        doc = json.load(f)
    rows = {}
    for name, rec in doc["points"].items():
        row = {"d.half": rec.get("half")}
        row.update({key: rec[field] for field, key in _RECORD_KEYS.items() if rec.get(field) is not None})
        rows[name] = row
    return rows


def _chip_rows(chip_sources: list[str], records: tuple[str, ...] = ()) -> dict[str, dict]:
    """{point: row} of the chip's side: records first, then the studies (a later one wins)."""
    chip: dict[str, dict] = {}
    for path in records:
        chip.update(read_record(path))
    for src in chip_sources:
        chip.update(_rows(src))
    return chip


def export_record(chip_sources: list[str], what: str, command: str) -> dict:
    """A chip record of the chip's studies: per point its half and what the chip stored."""
    chip = _chip_rows(chip_sources)
    points = {}
    for name, row in sorted(chip.items()):
        rec: dict = {"half": _text(row.get("d.half"))}
        for field, key in _RECORD_KEYS.items():
            v = _text(row.get(key)) if field in ("chip_outcome", "chip_libtpu") else _num(row.get(key))
            if v is not None:
                rec[field] = v
        points[name] = rec
    return {"what": what, "command": command, "points": points}


def collect(plan_source: str, chip_sources: list[str], records: tuple[str, ...] = ()) -> list[Point]:
    """The plan's points beside the chip's (_chip_rows)."""
    plan = _rows(plan_source)
    chip = _chip_rows(chip_sources, records)
    points = []
    for name, p in plan.items():
        c = chip.get(name)
        points.append(Point(
            name=name, half=str(p.get("d.half")), plan_outcome=str(p["outcome"]),
            chip_outcome=str(c["outcome"]) if c is not None else None,
            predicted_step=_num(p.get("plan.predicted_step_time")),
            chip_predicted_step=_num(c.get("plan.predicted_step_time")) if c is not None else None,
            measured_step=_num(c.get("step_time")) if c is not None else None,
            plan_bytes=_num(p.get("plan.peak_bytes")),
            chip_bytes=_num(c.get("plan.peak_bytes")) if c is not None else None,
            measured_bytes=_num(c.get("measured_peak_bytes")) if c is not None and c["outcome"] == "ok" else None,
            plan_libtpu=_text(p.get("env.libtpu")), chip_libtpu=_text(c.get("env.libtpu")) if c is not None else None))
    return points


def _text(v) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / GIB:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def table(points: list[Point]) -> str:
    head = ("| point | half | plan | chip | predicted ms | measured ms | error | chip-compile error | "
            "plan GiB | chip compiled GiB | measured GiB | measured / compiled |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in sorted(points, key=lambda p: p.name):
        lines.append(f"| {p.name} | {p.half} | {p.plan_outcome} | {p.chip_outcome or 'not run'} | "
                     f"{_ms(p.predicted_step)} | {_ms(p.measured_step)} | {_pct(p.error)} | {_pct(p.chip_error)} | "
                     f"{_gib(p.plan_bytes)} | {_gib(p.chip_bytes)} | {_gib(p.measured_bytes)} | "
                     f"{_pct(p.memory_error)} |")
    return "\n".join(lines)


def summary_text(s: Summary, points: list[Point]) -> str:
    def mm(mean, mx):
        return "-" if mean is None else f"mean {mean:.1%}, max {mx:.1%}"
    libs = sorted({f"plan libtpu {p.plan_libtpu}" for p in points if p.plan_libtpu}
                  | {f"chip libtpu {p.chip_libtpu}" for p in points if p.chip_libtpu})
    side = (f"{s.predicted_faster} predicted faster, {s.predicted_slower} slower"
            + (f" ({max(s.predicted_faster, s.predicted_slower) / s.trained:.0%} on one side)" if s.trained else ""))
    return "\n".join([
        f"step time, plan made here: {s.trained} trained points, {mm(s.mean_abs_error, s.max_abs_error)}; "
        f"held-out half: {s.held_out} points, {mm(s.held_out_mean_abs_error, s.held_out_max_abs_error)}",
        f"side: {side}",
        f"step time, the roofline over the chip compiler's own HLO: "
        f"{mm(s.chip_compile_mean_abs_error, s.chip_compile_max_abs_error)}",
        f"fit verdicts: {s.verdicts_agree} of {s.verdicts_compared} agree",
        f"memory, measured peak / the chip's compiled peak: {s.memory_compared} points, "
        f"{mm(s.memory_mean_abs_error, s.memory_max_abs_error)}",
        "compilers: " + "; ".join(libs),
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", help="run folder or storage URL of the plan made here (not needed for --export)")
    ap.add_argument("--chip", action="append", default=[],
                    help="run folder or storage URL of the chip's study (repeatable)")
    ap.add_argument("--measured", action="append", default=[],
                    help="a chip record (JSON, e.g. benchmarks/data/onchip_v5e_run2_measured.json; repeatable)")
    ap.add_argument("--export", default=None, metavar="FILE",
                    help="write the --chip studies' points as a chip record to FILE, and stop")
    ap.add_argument("--what", default="", help="--export: what the record holds (the run, the chip, the date)")
    ap.add_argument("--command", default="", help="--export: the command that ran the chip's studies")
    ap.add_argument("--held-out", default="b", help="the half no figure was set from, or several: b,c (default b)")
    ap.add_argument("--json", default=None, help="also write the points and the summary to this file")
    args = ap.parse_args(argv)
    if args.export:
        if not args.chip:
            ap.error("--export needs at least one --chip study")
        with open(args.export, "w") as f:
            json.dump(export_record(args.chip, args.what, args.command), f, indent=1)
        return 0
    if not args.plan:
        ap.error("--plan is required (the plan made here)")
    if not args.chip and not args.measured:
        ap.error("give the chip's side: --chip STUDY and/or --measured RECORD")
    points = collect(args.plan, args.chip, tuple(args.measured))
    if not points:
        print(f"no trial with a `point` decision in {args.plan}", file=sys.stderr)
        return 1
    s = summarize(points, args.held_out)
    print(table(points))
    print()
    print(summary_text(s, points))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"points": [asdict(p) for p in points], "summary": asdict(s)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
