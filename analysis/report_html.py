"""report.html: one self-contained page (PNG figures as data URIs, inline CSS and script)."""
from __future__ import annotations

import base64
import html

import pandas as pd

from . import fmt
from .recommend import Recommendation
from .tables import ROLES_NOTE, STEP_NOTE

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
dl.header { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.header dt { font-weight: bold; } dl.header dd { margin: 0; }
.predicted { background: #fff3cd; border: 1px solid #e0b400; padding: 0.5em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #eee; } table.sortable th { cursor: pointer; }
td.text { text-align: left; } tr.front td { font-weight: bold; }
img { max-width: 100%; }
.scroll { overflow-x: auto; max-width: 100%; }
.recommendation { background: #e8f4ea; border: 1px solid #5a9e6f; padding: 0.6em 1em; }
.recommendation pre { background: #fff; padding: 0.4em; overflow-x: auto; }
"""

# Click a header to sort by it; click again to reverse. Cells carry data-sort values.
_SORT_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th, column) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0];
    var up = th.dataset.order !== "up"; th.dataset.order = up ? "up" : "down";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[th.cellIndex].dataset.sort, y = b.cells[th.cellIndex].dataset.sort;
      var nx = parseFloat(x), ny = parseFloat(y), r;
      if (x === "" && y !== "") return 1; if (y === "" && x !== "") return -1;
      r = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return up ? r : -r;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""


def _image(png: bytes, alt: str, element_id: str | None = None) -> str:
    data = base64.b64encode(png).decode("ascii")
    id_attr = f' id="{element_id}"' if element_id else ""
    return f'<img{id_attr} alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def table(frame: pd.DataFrame, predicted: bool, sortable: bool = False,
          element_id: str | None = None, front_numbers: set | None = None) -> str:
    if frame.empty:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(fmt.title(c, predicted))}</th>" for c in frame.columns)
    rows = []
    for record in frame.to_dict("records"):
        cells = []
        for column, raw in record.items():
            text = fmt.value(column, raw)
            numeric = isinstance(raw, (int, float)) and not isinstance(raw, bool)
            css = "" if numeric else ' class="text"'
            cells.append(f'<td{css} data-sort="{html.escape(fmt.sort_key(raw))}">'
                         f"{html.escape(text)}</td>")
        front = front_numbers is not None and record.get("number") in front_numbers
        row_attrs = ' class="front"' if front else ""
        rows.append(f"<tr{row_attrs}>{''.join(cells)}</tr>")
    attrs = (' class="sortable"' if sortable else "") + \
        (f' id="{element_id}"' if element_id else "")
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def recommendation(rec: Recommendation | None, predicted: bool) -> str:
    """The opening block: the trial to use, why, and the commands that run it."""
    if rec is None:
        return ('<div class="recommendation" id="recommendation"><h2>Recommendation</h2>'
                "<p>No trial has finite scores yet: nothing to recommend.</p></div>")
    kind = " (predicted)" if predicted else ""
    items = ["decisions: " + ", ".join(f"<code>{html.escape(f'{k}={v}')}</code>" for k, v in rec.decisions.items()),
             "scores: " + html.escape(", ".join(f"{k} {v}" for k, v in rec.scores.items())),
             *[html.escape(reason) for reason in rec.reasons]]
    return (f'<div class="recommendation" id="recommendation"><h2>Recommendation{kind}</h2>'
            f"<p><b>Use trial {rec.number}</b>, {html.escape(rec.choice)}.</p>"
            "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"
            "<p>Run it:</p><pre>" + html.escape("\n".join(rec.commands)) + "</pre></div>")


def render(header: list[tuple[str, str]], predicted: bool, pareto_png: bytes,
           effect_pngs: dict[str, bytes], best: pd.DataFrame, front: pd.DataFrame,
           comparison: pd.DataFrame, trials: pd.DataFrame,
           failures: dict[str, pd.DataFrame], loss_line: str | None = None,
           rec: Recommendation | None = None, roles: pd.DataFrame | None = None,
           curves: tuple[bytes, pd.DataFrame] | None = None,
           corrected: tuple[pd.DataFrame, str | None] | None = None,
           steps: pd.DataFrame | None = None, quant: tuple[str, pd.DataFrame] | None = None) -> str:
    """The page. quant: int8 against bf16 (analysis/quality.py: the rule and the fastest quantized
    trial, then the table). loss_line: what the objectives loss and time to train are, one line each;
    curves: the loss curves per math group (PNG) and their legend table; steps: where each front
    trial's predicted step goes (tables.step_breakdown)."""
    title = dict(header)["study"]
    kind = "predicted" if predicted else "measured"
    front_numbers = set(front["number"].tolist()) if len(front) else set()
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>paxsearch report: {html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>paxsearch report: {html.escape(title)}</h1>",
    ]
    if predicted:
        parts.append('<p class="predicted"><b>Predicted figures.</b> Trials were compiled, '
                     "not run: MFU, memory and every other score below are predictions.</p>")
    parts.append(recommendation(rec, predicted))
    parts.append('<dl class="header">' + "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header) + "</dl>")
    for line in (loss_line or "").splitlines():  # what loss and time to train are: token counts
        parts.append(f'<p class="loss-objective">{html.escape(line)}</p>')
    parts += [f"<h2>Pareto front ({kind})</h2>",
              _image(pareto_png, f"MFU against memory per device ({kind})", "pareto-plot"),
              f"<h3>Best per objective and knee ({kind})</h3>", table(best, predicted),
              f"<h3>Non-dominated trials ({kind})</h3>", table(front, predicted)]
    if quant is not None:
        parts += ['<h2 id="quantization">Quantization: speed gain against loss cost (measured)</h2>',
                  *[f"<p>{html.escape(line)}</p>" for line in quant[0].splitlines()], table(quant[1], False)]
    if steps is not None and not steps.empty:
        parts += ['<h3 id="step-parts">Where the predicted step goes</h3>', f"<p>{html.escape(STEP_NOTE)}</p>",
                  table(steps, False)]
    if not comparison.empty:
        parts += ["<h2>Predicted vs measured</h2>",
                  "<p>Ratios are measured / predicted.</p>", table(comparison, False)]
    if corrected is not None and not corrected[0].empty:
        parts += ['<h2 id="corrected">Predicted, corrected and measured MFU</h2>',
                  f"<p>{html.escape(corrected[1] or '')}</p>", table(corrected[0], False)]
    parts.append(f"<h2>Effect of each decision ({kind})</h2>")
    if roles is not None and not roles.empty:
        parts += [f'<p id="decision-roles">{html.escape(ROLES_NOTE)}</p>', table(roles, False)]
    if not effect_pngs:
        parts.append("<p>No decision has scored trials.</p>")
    for name, png in effect_pngs.items():
        parts.append(f"<div>{_image(png, f'effect of {name} ({kind})')}</div>")
    if curves:
        parts += ["<h2>Loss curves per math group (measured)</h2>",
                  "<p>One line per math group (trials that train the same model on the same batches; "
                  "they differ only in layout), the mean training loss of its trials at each logged step, "
                  "labelled by the decisions that set the groups apart.</p>",
                  _image(curves[0], "training loss against step, one line per math group", "loss-curves"),
                  table(curves[1], False, element_id="loss-groups")]
    parts += [f"<h2>All trials ({kind}; click a column to sort)</h2>",
              table(trials, predicted, sortable=True, element_id="trials",
                    front_numbers=front_numbers)]
    parts.append("<h2>Failures by kind</h2>")
    if not failures:
        parts.append("<p>No trial failed.</p>")
    for failure_kind, group in failures.items():
        parts += [f"<h3>{html.escape(failure_kind)} ({len(group)})</h3>",
                  table(group, predicted)]
    parts += [f"<script>{_SORT_SCRIPT}</script>", "</body></html>"]
    return "\n".join(parts)
