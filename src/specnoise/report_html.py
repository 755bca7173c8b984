"""``report.html`` beside every ``report.md``: one self-contained page a researcher opens in a browser or mails on.

Built from what ``report.build_report`` already computed (its DataFrame, tables, plots and notes) with a string
template: no web framework, nothing fetched from the network. The PNG plots are inlined as ``data:`` URIs; the tables
sort by a click on a column header and are filtered by model / benchmark / decoder / category with a few lines of
inline JavaScript. The page also shows each row's speedup with its 95% CI as an error bar, marks the rows whose
timing is within the machine's noise (``timing_noisy``), lists the sweep's command and the versions the jobs ran with,
links every job's directory, the Optuna search's summary where the sweep is one (``tune.json``), and the verdicts of
the study's claims where the report sits in an ``experiments/<study>/`` folder whose README gives them.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path

import pandas as pd
import yaml

from specnoise.bench.timing import ADVICE
from specnoise.files import write_atomic

FILTERS = ("model", "benchmark", "decoder", "category")  # the select boxes, for every table with such a column
COLUMNS = ("model", "draft", "benchmark", "decoder", "category", "prompts", "new_tokens", "mean_accepted_tokens",
           "tokens_per_second", "speedup", "speedup_ci_low", "speedup_ci_high", "timing_noisy", "lossless_fraction",
           "task_score", "ref_nll")
VERSION_KEYS = ("torch", "transformers", "platform", "device_name", "dtype", "torch_threads", "attn_implementation")

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f2f2f2;cursor:pointer;user-select:none}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.t{text-align:left}tr.noisy td{background:#fff4d6}.badge{background:#e6a100;color:#fff;border-radius:3px;
padding:0 4px;font-size:11px}.fail{color:#b00020}code,pre{background:#f6f6f6;padding:2px 4px}
pre{white-space:pre-wrap}#filters select{margin-right:1em}img{max-width:100%;display:block;margin:.5em 0 1.5em}
"""

SCRIPT = """
function cellValue(td){const v=td.dataset.v!==undefined?td.dataset.v:td.textContent.trim();
  const n=parseFloat(v);return v!==''&&!isNaN(n)&&isFinite(v)?n:v.toLowerCase();}
function sortBy(th){const table=th.closest('table'),body=table.tBodies[0],i=th.cellIndex;
  const desc=th.classList.contains('asc');table.querySelectorAll('th').forEach(h=>h.classList.remove('asc','desc'));
  th.classList.add(desc?'desc':'asc');const rows=Array.from(body.rows);
  rows.sort((a,b)=>{const x=cellValue(a.cells[i]),y=cellValue(b.cells[i]);
    if(x===y)return 0;if(x===''||y==='')return x===''?1:-1;
    const c=(typeof x===typeof y)?(x<y?-1:1):(typeof x==='number'?-1:1);return desc?-c:c;});
  rows.forEach(r=>body.appendChild(r));}
function applyFilters(){const chosen={};document.querySelectorAll('#filters select').forEach(s=>{
    if(s.value)chosen[s.name]=s.value;});
  document.querySelectorAll('table.data tbody tr').forEach(tr=>{let show=true;
    for(const [k,v] of Object.entries(chosen)){if(tr.dataset[k]!==undefined&&tr.dataset[k]!==v)show=false;}
    tr.style.display=show?'':'none';});}
document.querySelectorAll('table.data th').forEach(th=>th.addEventListener('click',()=>sortBy(th)));
document.querySelectorAll('#filters select').forEach(s=>s.addEventListener('change',applyFilters));
applyFilters();
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value))


def fmt(value: object) -> str:
    if isinstance(value, float):
        return "" if value != value else (f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}")
    return "" if value is None else str(value)


def ci_bar(speedup: float, low: float, high: float, top: float) -> str:
    """The speedup (dot) and its 95% CI (bar) on a 0..top scale, AR's 1.0 as a grey tick: an inline SVG."""
    width, x = 120, lambda v: 4 + (width - 8) * min(max(v / top, 0.0), 1.0)
    return (f'<svg class="ci" width="{width}" height="12" role="img" aria-label="CI {low:.3g}-{high:.3g}">'
            f'<line x1="{x(1.0):.1f}" y1="0" x2="{x(1.0):.1f}" y2="12" stroke="#999"/>'
            f'<line x1="{x(low):.1f}" y1="6" x2="{x(high):.1f}" y2="6" stroke="#1f77b4" stroke-width="2"/>'
            f'<line x1="{x(low):.1f}" y1="2" x2="{x(low):.1f}" y2="10" stroke="#1f77b4"/>'
            f'<line x1="{x(high):.1f}" y1="2" x2="{x(high):.1f}" y2="10" stroke="#1f77b4"/>'
            f'<circle cx="{x(speedup):.1f}" cy="6" r="3" fill="#d62728"/></svg>')


def table(df: pd.DataFrame, links: dict[str, str] | None = None, noisy: pd.Series | None = None) -> str:
    """A sortable table; rows carry data-model / -benchmark / -decoder / -category for the filters."""
    if df.empty:
        return "<p>(no rows)</p>"
    links = links or {}
    has_ci = {"speedup", "speedup_ci_low", "speedup_ci_high"} <= set(df.columns)
    top = max(2.0, float(pd.to_numeric(df["speedup_ci_high"], errors="coerce").max(skipna=True) or 0) * 1.05) \
        if has_ci else 0.0
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns) + ("<th>speedup, 95% CI</th>" if has_ci else "")
    rows = []
    for i, (_, row) in enumerate(df.iterrows()):
        attrs = "".join(f' data-{k}="{esc(row[k])}"' for k in FILTERS if k in df.columns)
        mark = noisy is not None and bool(noisy.iloc[i])
        cells = []
        for col, value in row.items():
            text = esc(fmt(value))
            if col == "job" and str(value) in links:
                text = f'<a href="{esc(links[str(value)])}">{text}</a>'
            if col == "timing_noisy":
                text = '<span class="badge">NOISY</span>' if value is True else ""
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
            kind = "" if numeric else ' class="t"'
            cells.append(f'<td{kind} data-v="{esc(value) if numeric else esc(fmt(value))}">{text}</td>')
        if has_ci:
            s, lo, hi = (row[c] for c in ("speedup", "speedup_ci_low", "speedup_ci_high"))
            ok = all(isinstance(v, (int, float)) and v == v for v in (s, lo, hi))
            cells.append(f'<td data-v="{s if ok else ""}">{ci_bar(s, lo, hi, top) if ok else ""}</td>')
        rows.append(f'<tr{attrs}{" class=noisy" if mark else ""}>{"".join(cells)}</tr>')
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def filters(df: pd.DataFrame) -> str:
    boxes = []
    for key in FILTERS:
        if key not in df or df[key].nunique(dropna=True) < 2 and key != "category":
            continue
        values = sorted(df[key].dropna().astype(str).unique())
        chosen = "all" if key == "category" and "all" in values else ""
        options = [f'<option value=""{" selected" if not chosen else ""}>every {key}</option>']
        options += [f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(v)}</option>' for v in values]
        boxes.append(f'<label>{key} <select name="{key}">{"".join(options)}</select></label>')
    return f'<div id="filters">{"".join(boxes)}</div>' if boxes else ""


def results_frame(df: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """One row per job x decoder x category: the job, what the sweep varied, then the metrics."""
    cols = ["job", *[c for c in swept if c in df and c not in COLUMNS], *[c for c in COLUMNS if c in df]]
    return df[list(dict.fromkeys(cols))].reset_index(drop=True)


def image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{esc(path.stem)}" src="data:image/png;base64,{data}"><figcaption>{esc(path.stem)}' \
           "</figcaption></figure>"


def command(jobs: list) -> str | None:
    """The sweep's command line: the overrides every job shares, and each varying key with its values."""
    lists = [yaml.safe_load(p.read_text()) or [] for p in (j.dir / ".hydra" / "overrides.yaml" for j in jobs
                                                            if j.dir is not None) if p.is_file()]
    if not lists:
        return None
    shared = [o for o in lists[0] if all(o in other for other in lists)]
    varying: dict[str, list[str]] = {}
    for overrides in lists:
        for o in overrides:
            if o not in shared:
                key, _, value = str(o).partition("=")
                varying.setdefault(key, [])
                if value not in varying[key]:
                    varying[key].append(value)
    swept = [f"{k}={','.join(v)}" for k, v in varying.items()]
    return " ".join(["python -m specnoise", *(["-m"] if len(lists) > 1 else []), *map(str, shared), *swept])


def versions(jobs: list) -> dict[str, str]:
    """What the jobs ran with (results.json meta), each value once."""
    found: dict[str, list[str]] = {}
    for job in jobs:
        path = job.dir / "results.json" if job.dir is not None else None
        if path is None or not path.is_file():
            continue
        try:
            meta = json.loads(path.read_text()).get("meta") or {}
        except json.JSONDecodeError:
            continue
        for key in VERSION_KEYS:
            if meta.get(key) is not None and str(meta[key]) not in found.setdefault(key, []):
                found[key].append(str(meta[key]))
    return {k: ", ".join(v) for k, v in found.items() if v}


def search_section(roots: list[Path], out_dir: Path) -> str:
    """The Optuna search of a tune-* sweep (its tune.json), if the report covers one."""
    parts = []
    found = sorted(p for r in roots for p in Path(r).glob("tune.json"))  # a search's sweep directory
    for path in found or [p for p in [out_dir / "tune.json"] if p.is_file()]:  # or a copy beside the report
        summary = json.loads(path.read_text())
        best = summary.get("best")
        trials = pd.DataFrame([{"trial": t["trial"], "state": t["state"] + (" (interrupted)" if t.get("interrupted")
                                                                             else " (default)" if t.get("default")
                                                                             else ""),
                                "objective": t.get("value"), **t.get("params", {}),
                                **{k: t.get(k) for k in ("speedup", "speedup_ci_low", "speedup_ci_high",
                                                         "mean_accepted_tokens", "lossless_fraction",
                                                         "timing_noisy")}, "job": t.get("job")}
                               for t in summary.get("trials", [])])
        parts.append(f"<h3>Search {esc(summary.get('study'))}</h3><p>{summary.get('finished')} of "
                     f"{summary.get('budget')} trials done, {summary.get('failed')} failed; objective: "
                     f"{esc(summary.get('objective'))} (the speedup's 95% CI lower bound), "
                     f"{esc(summary.get('direction'))}.</p>")
        if best:
            setting = " ".join(f"{k}={v}" for k, v in best["params"].items())
            parts.append(f"<p>Best: trial {best['trial']}, <code>{esc(setting)}</code>: speedup "
                         f"{fmt(best.get('speedup'))} (95% CI {fmt(best.get('speedup_ci_low'))}-"
                         f"{fmt(best.get('speedup_ci_high'))}).</p>")
        default = summary.get("default")
        if default:
            setting = " ".join(f"{k}={v}" for k, v in default["params"].items())
            parts.append(f"<p>The configured setting (trial {default['trial']}), <code>{esc(setting)}</code>: speedup "
                         f"{fmt(default.get('speedup'))} (95% CI {fmt(default.get('speedup_ci_low'))}-"
                         f"{fmt(default.get('speedup_ci_high'))}).</p>")
        if summary.get("rerun"):
            parts.append(f"<p>Re-run the winner:</p><pre>{esc(summary['rerun'])}</pre>")
        if not trials.empty:
            noisy = trials["timing_noisy"] == True if "timing_noisy" in trials else None  # noqa: E712
            parts.append(table(trials, noisy=noisy))
    return ("<h2>Optuna search</h2>" + "".join(parts)) if parts else ""


def verdicts(out_dir: Path) -> str:
    """The study's verdict (its README's ``**Verdict ...**`` line) and its rows of the claims table in the
    experiments README, where the report sits in ``experiments/<study>/<folder>/``."""
    study = out_dir.resolve().parent
    lines: list[str] = []
    readme = study / "README.md"
    if readme.is_file():
        lines += [f"<p>{inline(line)}</p>" for line in readme.read_text().splitlines() if line.startswith("**Verdict")]
    claims = study.parent / "README.md"
    if claims.is_file():
        text = claims.read_text().splitlines()
        header = current = None  # the first claims table's header; the header of the table being read, if a claims one
        rows = []
        for line, above in zip(text, [""] + text):
            if line.startswith("|") and not above.startswith("|"):  # a table starts: its header
                current = line if "verdict" in line.lower() else None
                header = header or current
            elif line.startswith("|") and current and f"]({study.name}/" in line:
                rows.append(line)
        if header and rows:
            cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
            head = "".join(f"<th>{esc(c)}</th>" for c in cells(header))
            body = "".join("<tr>" + "".join(f'<td class="t">{inline(c)}</td>' for c in cells(r)) + "</tr>"
                           for r in rows)
            lines.append(f'<table class="claims"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
    return ("<h2>Claims and verdicts</h2>" + "".join(lines)) if lines else ""


def inline(text: str) -> str:
    """Markdown's bold, code and links in one line of a README, the rest escaped."""
    out = esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`(.+?)`", r"<code>\1</code>", out)
    return re.sub(r"\[(.+?)\]\((.+?)\)", r"\1", out)


def write_html(out_dir: Path, title: str, df: pd.DataFrame, sections: dict[str, pd.DataFrame], jobs: list,
               plots: list[Path], notes: list[str], swept: list[str], roots: list[Path]) -> Path:
    """Write ``out_dir/report.html`` from build_report's pieces; returns its path."""
    links = {str(j.path): os.path.relpath(j.dir, out_dir) + "/" for j in jobs if j.dir is not None}
    body = [f"<h1>{esc(title)}</h1>",
            f"<p>{len(jobs)} jobs: {sum(bool(j.rows) for j in jobs)} with results, "
            f"{sum(j.error is not None for j in jobs)} failed. Click a column header to sort; the boxes filter "
            "every table.</p>"]
    cmd = (out_dir / "command.txt").read_text() if (out_dir / "command.txt").is_file() else command(jobs)
    if cmd:
        body.append(f"<h2>Command</h2><pre>{esc(cmd.strip())}</pre>")
    found = versions(jobs)
    if found:
        body.append("<h2>Versions</h2><ul>" + "".join(f"<li>{esc(k)}: {esc(v)}</li>" for k, v in found.items())
                    + "</ul>")
    body.append(verdicts(out_dir))
    body.append(search_section(roots, out_dir))
    body.append(filters(df))
    if not df.empty:
        frame = results_frame(df, swept)
        noisy = frame["timing_noisy"] == True if "timing_noisy" in frame else None  # noqa: E712
        body.append("<h2>Results</h2>" + table(frame, links, noisy))
    if any(line.startswith("## Timing noise") for line in notes):
        body.append(f'<p><span class="badge">NOISY</span> {esc(ADVICE)}</p>')
    for name, section in sections.items():
        if name != "main":
            body.append(f"<h2>{esc(name)}</h2>" + table(section.reset_index(drop=True)))
    if plots:
        body.append("<h2>Plots</h2>" + "".join(image(p) for p in plots if p.is_file()))
    failed = [j for j in jobs if j.error is not None or (not j.rows and not j.train)]
    if failed:
        items = "".join(f'<li><a href="{esc(links.get(str(j.path), ""))}">{esc(j.path)}</a>: '
                        f'<span class="fail">{esc(j.error or j.note)}</span></li>' for j in failed)
        body.append(f"<h2>Failed or unfinished jobs</h2><ul>{items}</ul>")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}<script>{SCRIPT}</script></body></html>\n")
    write_atomic(out_dir / "report.html", page)
    return out_dir / "report.html"
