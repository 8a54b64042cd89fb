"""Compare two studies trial by trial, field by field: does a refactor leave the same seed giving
the same trials, losses and plans?

Peer: the same study, run on the tree before the change.

    python benchmarks/compare_studies.py RUN_A RUN_B [--study NAME]

Trials are paired by number. For each pair every stored field is compared: the decisions, the
config, the state and objective values, the failure kind and message, and every key of the
plan and measured dicts. Figures that are timings of this machine (wall seconds, MFU, tokens/s,
step time, the measured process RSS) differ between any two runs and are listed apart, never
counted as a difference; everything else must be equal (floats exactly), or the script names
it and exits 1. Fields present on one side only are listed (a new release may add fields).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import optuna

# Figures that measure this machine's speed, not what was computed: always timings.
TIMING_KEYS = {"compile_seconds", "mfu", "hfu", "tokens_per_sec", "step_time", "peak_bytes@measured"}
# A measured (CPU) trial's predictions are priced with this host's measured matmul peak and copy
# bandwidth: timings too, but the roofline's FLOPs, bytes and collectives must still match.
CPU_PREDICTION_KEYS = {"predicted_step_time", "predicted_mfu", "predicted_tokens_per_sec", "peak_flops_per_device"}


def _without_seconds(obj):
    """A roofline dict without its times (keys ending in _s or seconds, the overlap fraction)."""
    if isinstance(obj, dict):
        return {k: _without_seconds(v) for k, v in obj.items()
                if not (k.endswith("_s") or k.endswith("seconds") or k == "overlap_fraction")}
    if isinstance(obj, list):
        return [_without_seconds(v) for v in obj]
    return obj


def _load(run: str, name: str | None) -> optuna.Study:
    url = run if "://" in run else f"sqlite:///{run}/study.db"
    names = optuna.get_all_study_names(url)
    return optuna.load_study(study_name=name or names[0], storage=url)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(a: optuna.Study, b: optuna.Study) -> tuple[list[str], list[str], list[str], int]:
    diffs, timing, one_side, fields = [], [], [], 0
    ta = {t.number: t for t in a.get_trials()}
    tb = {t.number: t for t in b.get_trials()}
    if sorted(ta) != sorted(tb):
        diffs.append(f"trial numbers differ: {sorted(ta)} vs {sorted(tb)}")
    for n in sorted(set(ta) & set(tb)):
        x, y = ta[n], tb[n]
        measured_values = x.values is not None and not x.user_attrs.get("predicted")
        for what, u, v in (("state", x.state.name, y.state.name), ("params", x.params, y.params),
                           ("decisions", x.user_attrs.get("decisions"), y.user_attrs.get("decisions")),
                           ("config", x.user_attrs.get("config"), y.user_attrs.get("config")),
                           ("failure_kind", x.user_attrs.get("failure_kind"), y.user_attrs.get("failure_kind")),
                           ("memory_bytes", x.user_attrs.get("memory_bytes"), y.user_attrs.get("memory_bytes"))):
            fields += 1
            if not _same(u, v):
                diffs.append(f"#{n} {what}: {u!r} != {v!r}")
        if x.values is not None and y.values is not None:
            names = [o["name"] for o in a.user_attrs.get("objectives") or []] or [str(i) for i in range(len(x.values))]
            for name, u, v in zip(names, x.values, y.values, strict=True):
                fields += 1
                (timing if name == "mfu" and measured_values else diffs).append(f"#{n} value {name}: {u} vs {v}") \
                    if not _same(u, v) else None
        for section in ("plan", "measured"):
            pu, pv = x.user_attrs.get(section) or {}, y.user_attrs.get(section) or {}
            for key in sorted(set(pu) | set(pv)):
                if key not in pu or key not in pv:
                    one_side.append(f"#{n} {section}.{key} only in {'A' if key in pu else 'B'}")
                    continue
                fields += 1
                u, v = pu[key], pv[key]
                priced_here = section == "plan" and not x.user_attrs.get("predicted")
                if priced_here and key == "roofline":
                    u, v = _without_seconds(u), _without_seconds(v)
                if _same(u, v):
                    continue
                if (key in TIMING_KEYS or f"{key}@{section}" in TIMING_KEYS
                        or (priced_here and key in CPU_PREDICTION_KEYS)):
                    timing.append(f"#{n} {section}.{key}")
                else:
                    diffs.append(f"#{n} {section}.{key}: {json.dumps(u)[:120]} != {json.dumps(v)[:120]}")
    return diffs, timing, one_side, fields


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--study", default=None)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    a, b = _load(args.run_a, args.study), _load(args.run_b, args.study)
    diffs, timing, one_side, fields = compare(a, b)
    print(f"{len(a.get_trials())} trials, {fields} fields compared: {len(diffs)} differ; "
          f"{len(timing)} timing figures differ (expected); {len(one_side)} fields on one side only")
    for line in one_side:
        print("  one side:", line)
    for line in diffs:
        print("  DIFFERS:", line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
