"""Plan MaxText's 2025 Llama recipes (benchmarks/published.py RECIPES) on their TPU slices,
compile-only on this CPU, through `paxsearch run`, and compare the predicted MFU with the
published one (converted to our convention).

Question: how close is the planner's predicted MFU to MaxText's published 2025 recipes?
Peer: the recipes' published throughput (benchmarks/published.py RECIPES, converted to our MFU).

Each recipe's nearest expressible config (`published.recipe_config`: preset, mesh, global
batch, custom remat with host offload, flash attention, compiler flag set) becomes a one-point
space file written into the run folder (so it can be re-run by hand), planned by
`paxsearch run SPACE --target tpu:<slice> --workers 1 --trials 1`.

    python benchmarks/bench_recipes.py                                # every recipe, one compile at a time
    python benchmarks/bench_recipes.py --only "v6e-256 Llama3.1-8B"  # one recipe (repeatable)
    python benchmarks/bench_recipes.py --only "v6e-256 Llama3.1-8B" --set remat=full --tag full
                                                                      # a variant (its own run folder)
    python benchmarks/bench_recipes.py --plan-compile full            # full compiles, not the HLO passes
    python benchmarks/bench_recipes.py --compose no_collective_pipeliner
                                      # each recipe's flag set composed with another (a variant, tagged +SET)
    python benchmarks/bench_recipes.py --report                       # re-print from stored results

Prints, per recipe: fits (peak / usable HBM GiB per chip, and the compiled breakdown:
arguments, temporaries, outputs, and the outputs aliased to arguments), the analytic state
per chip (parameters, gradients + AdamW moments, sharded over the slice), predicted and
published MFU, their ratio, and the plan's wall time (the whole `paxsearch run`, process
start to exit).
"""
from __future__ import annotations

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from paxsearch.benchmarks import bench_published, published

GiB = 2 ** 30


def space_text(r: published.Recipe, timeout: int) -> str:
    """The recipe's one-point space: bench_published's template with the preset's own fields."""
    return bench_published.SPACE.format(script="bench_recipes.py", name=r.name, published_in=r.published_in,
                                        config=r.config, target=r.target, timeout=timeout, preset=r.preset,
                                        attention=r.attention, model_fields="", ici=r.ici, dcn=(1, 1, 1),
                                        rules="default", global_batch=r.global_batch, remat=r.remat, flags=r.flags)


class _Named:
    """A recipe under another name (a variant's run folder), as bench_published.plan_row takes it."""

    def __init__(self, recipe: published.Recipe, tag: str):
        self.name = recipe.name + (f" {tag}" if tag else "")
        self.target = recipe.target


def state_bytes_per_chip(r: published.Recipe) -> float:
    """Parameters, gradients and both AdamW moments, fully sharded over the slice (what MaxText's
    fsdp over every chip holds at the update), per chip: trainer/state_memory.py's one formula."""
    from paxsearch.trainer import flops
    from paxsearch.trainer.state_memory import dtype_bytes, train_state_bytes
    m = published.recipe_model(r)
    return float(train_state_bytes(flops.param_count(m), dtype_bytes(m.param_dtype), r.chips))


def figures(r: published.Recipe, result: dict | None) -> dict:
    from paxsearch.store.plan import Plan

    plan = Plan.from_stored((result or {}).get("plan")) or Plan()  # the stored plan holds the compiled breakdown
    pred = plan.predicted_mfu
    pub = published.recipe_converted_mfu(r)
    oom = (result or {}).get("failure_kind") == "predicted_oom"
    return {
        "fits": False if oom else (plan.fits if plan.peak_bytes else None),
        "peak_gib": plan.peak_bytes / GiB if plan.peak_bytes else None,
        "hbm_gib": plan.hbm_bytes / GiB if plan.hbm_bytes else None,
        "argument_gib": plan.argument_bytes / GiB if plan.argument_bytes is not None else None,
        "temp_gib": plan.temp_bytes / GiB if plan.temp_bytes is not None else None,
        "output_gib": plan.output_bytes / GiB if plan.output_bytes is not None else None,
        "alias_gib": plan.alias_bytes / GiB if plan.alias_bytes is not None else None,
        "state_gib": state_bytes_per_chip(r) / GiB,
        "predicted_mfu": pred, "published_mfu": pub, "ratio": pred / pub if pred else None,
        "wall_s": (result or {}).get("wall_s"), "failure": (result or {}).get("failure_kind"),
        "failure_message": (result or {}).get("failure_message"),
    }


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def report(rows: list[tuple[published.Recipe, str]], results: dict) -> str:
    lines = ["| recipe | remat (ours) | fits | peak / HBM GiB | args / temp / out / alias GiB | state GiB "
             "(analytic) | predicted MFU | published MFU (ours) | predicted / published | plan s | outcome |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, tag in rows:
        name = _Named(r, tag).name
        res = results.get(name)
        g = figures(r, res)
        fits = "-" if g["fits"] is None else ("yes" if g["fits"] else "**no**")
        remat = (res or {}).get("remat", r.remat)
        lines.append(
            f"| {name} | {remat} | {fits} | {_f(g['peak_gib'], '.2f')} / {_f(g['hbm_gib'], '.2f')} "
            f"| {_f(g['argument_gib'], '.2f')} / {_f(g['temp_gib'], '.2f')} / {_f(g['output_gib'], '.2f')} / "
            f"{_f(g['alias_gib'], '.2f')} | {g['state_gib']:.2f} | {_f(g['predicted_mfu'], '.2%')} "
            f"| {g['published_mfu']:.2%} | {_f(g['ratio'], '.2f')} | {_f(g['wall_s'], '.0f')} "
            f"| {g['failure'] or ('planned' if res else 'not run')} |")
    for r, tag in rows:
        g = figures(r, results.get(_Named(r, tag).name))
        if g["failure_message"]:
            lines.append(f"- {_Named(r, tag).name}: {g['failure']}: {str(g['failure_message'])[:400]}")
    return "\n".join(lines)


def plan_recipe(r: published.Recipe, out: str, timeout: int, sets: list[str], tag: str,
                plan_compile: str | None = None) -> dict:
    text = space_text(r, timeout)
    named = _Named(r, tag)
    if sets:  # pass the overrides to `paxsearch run --set` through the generated space's own command
        text = text.replace("STUDY = dict(", f"# variant: --set {' --set '.join(sets)}\nSTUDY = dict(", 1)
    extra = [a for s in sets for a in ("--set", s)] + (["--plan-compile", plan_compile] if plan_compile else [])
    result = bench_published.plan_row(named, out, timeout, text=text, extra_args=extra)
    result["remat"] = next((s.split("=", 1)[1] for s in sets if s.startswith("remat=")), r.remat)
    with open(os.path.join(out, bench_published.slug(named.name) + ".json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help="recipe name (repeatable); default every recipe")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_recipes"))
    ap.add_argument("--report", action="store_true", help="print from stored results only")
    ap.add_argument("--fresh", action="store_true", help="plan recipes that have a stored result again")
    ap.add_argument("--timeout", type=int, default=3000, help="per-compile limit, seconds")
    ap.add_argument("--set", action="append", default=[], help="a `paxsearch run --set` override (a variant)")
    ap.add_argument("--tag", default="", help="the variant's name, appended to the recipe's (needed with --set)")
    ap.add_argument("--plan-compile", choices=("passes", "full"), default=None,
                    help="the plans' method (paxsearch run --plan-compile); default: paxsearch's")
    ap.add_argument("--compose", default=None, metavar="SET",
                    help="plan each recipe with its flag set + SET (trainer/flagsets.py); a variant tagged +SET")
    args = ap.parse_args(argv)
    if args.compose:
        from paxsearch.trainer import flagsets
        flagsets.check(args.compose)  # one line for an unknown set
        args.tag = args.tag or f"+{args.compose}"
    if args.set and not args.tag:
        raise SystemExit("--set makes a variant: name it with --tag (its results are kept apart from the recipe's)")
    unknown = [n for n in args.only if n not in published.RECIPES_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown recipe(s) {unknown}; recipes: {', '.join(published.RECIPES_BY_NAME)}")
    recipes = [published.RECIPES_BY_NAME[n] for n in args.only] if args.only else list(published.RECIPES)
    print(published.recipes_table(), "", sep="\n")
    os.makedirs(args.out, exist_ok=True)
    rows = [(r, args.tag) for r in recipes]
    results = {}
    for r, tag in rows:
        name = _Named(r, tag).name
        res = None if args.fresh else bench_published.load_result(_Named(r, tag), args.out)
        if res is None and not args.report:
            sets = args.set + ([f"flags={r.flags}+{args.compose}" if r.flags != "default" else f"flags={args.compose}"]
                               if args.compose else [])
            res = plan_recipe(r, args.out, args.timeout, sets, tag, args.plan_compile)
        if res is not None:
            results[name] = res
    print(report(rows, results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
