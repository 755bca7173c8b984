"""report.html: self-contained, and working in a real browser (Chromium driven by Playwright).

The browser test needs Chromium from the system package manager (`apt-get install chromium`, which `make setup`
runs where it can) and the `playwright` package (the dev extra); it is skipped, saying which is missing, where they
cannot be installed, and fails instead in CI (SPECNOISE_REQUIRE_BROWSER). Playwright's own browser download is never
used: it drives the system's Chromium.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from specnoise.report import build_report
from test_report import result_row, write_job

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def sweep(root: Path) -> Path:
    """Three jobs of a PLD sweep on two models (speedups not in job order), one noisy, one failed; two categories."""
    for num, (model, tokens, speedup) in enumerate([("small-code-msn", 10, 1.3), ("small-code", 4, 0.8),
                                                    ("small-code-msn", 6, 1.1)]):
        rows = []
        for cat in ("all", "qa", "code"):
            rows.append(result_row("ar", cat, model=model, speedup_ci_low=1.0, speedup_ci_high=1.0))
            rows.append(result_row("pld", cat, model=model, speedup=speedup, mat=1.5, speedup_ci_low=speedup - 0.2,
                                   speedup_ci_high=speedup + 0.1, timing_noisy=num == 1))
        write_job(root / str(num), ["decoder=pld", f"model={model}", f"decoder.num_pred_tokens={tokens}"], rows)
        meta = {"meta": {"torch": "2.13.0+cpu", "transformers": "5.24.0", "platform": "Linux-test"}}
        data = json.loads((root / str(num) / "results.json").read_text())
        (root / str(num) / "results.json").write_text(json.dumps({**data, **meta}))
    write_job(root / "3", ["decoder=pld", "model=small-code", "decoder.num_pred_tokens=99"], error="error: boom")
    return root


@pytest.fixture
def report(tmp_path: Path) -> Path:
    out = build_report([sweep(tmp_path / "sweep")], tmp_path / "sweep" / "report", title="pld sweep")
    return out.parent / "report.html"


def test_html_is_self_contained_with_every_part(report: Path):
    page = report.read_text()
    pngs = sorted(report.parent.glob("*.png"))
    assert len(pngs) >= 2  # the decoder bars and the per-category bars
    assert page.count('src="data:image/png;base64,') == len(pngs)
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)  # nothing fetched: no CDN, no remote image
    assert "<script src" not in page and "<link" not in page
    assert 'class="noisy"' in page or "class=noisy" in page  # job 1's noisy rows are marked
    assert all(f'<select name="{key}"' in page for key in ("model", "decoder", "category"))
    assert '<select name="benchmark"' not in page  # one benchmark: nothing to filter by
    assert "python -m specnoise -m" in page and "decoder.num_pred_tokens=10,4,6,99" in page  # the sweep's command
    assert "transformers: 5.24.0" in page and "torch: 2.13.0+cpu" in page
    for job in ("0", "1", "2", "3"):  # links to every job's directory, relative to the report, and existing
        assert f'href="../{job}/"' in page and (report.parent / ".." / job).is_dir()
    assert "error: boom" in page
    assert page.count('<svg class="ci"') == 9 * 2  # a CI bar for AR and PLD in every row of the results table


def test_search_summary_and_verdicts(tmp_path: Path):
    study = tmp_path / "experiments" / "demo"
    sweep(study / "sweep")
    (study / "README.md").write_text("# demo\n\n**Verdict at this scale: `reproduced`.** PLD wins.\n")
    (tmp_path / "experiments" / "README.md").write_text(
        "| paper | claim | verdict | study |\n|---|---|---|---|\n"
        "| P | PLD is fast | reproduced | [demo](demo/README.md) |\n"
        "| Q | other | not reproduced | [other](other/README.md) |\n\n"
        "| study | what varies |\n|---|---|\n| [demo](demo/README.md) | an index row, not a claim |\n")
    trials = [{"trial": 0, "state": "COMPLETE", "value": 1.1, "params": {"decoder.num_pred_tokens": 10}, "job": "0",
               "speedup": 1.3, "speedup_ci_low": 1.1, "speedup_ci_high": 1.4},
              {"trial": 1, "state": "FAIL", "value": None, "params": {"decoder.num_pred_tokens": 4}, "job": "1",
               "interrupted": True}]
    (study / "sweep" / "tune.json").write_text(json.dumps({
        "study": "tune-pld", "objective": "speedup_ci_low", "direction": "maximize", "budget": 2, "finished": 1,
        "failed": 0, "best": trials[0], "rerun": "python -m specnoise decoder.num_pred_tokens=10", "trials": trials}))
    page = (build_report([study / "sweep"], study / "tiny").parent / "report.html").read_text()
    assert "<b>Verdict at this scale: <code>reproduced</code>.</b>" in page
    assert "an index row" not in page
    assert "PLD is fast" in page and "other" not in page.split("Claims and verdicts")[1].split("</table>")[0]
    assert "Search tune-pld" in page and "python -m specnoise decoder.num_pred_tokens=10" in page
    assert "FAIL (interrupted)" in page


def unavailable(reason: str):
    """Skip, except in CI (.ci/run sets SPECNOISE_REQUIRE_BROWSER where make setup could install Chromium)."""
    if os.environ.get("SPECNOISE_REQUIRE_BROWSER"):
        pytest.fail(reason)
    pytest.skip(reason)


def test_report_works_in_chromium(report: Path):
    browser_path = os.environ.get("SPECNOISE_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if browser_path is None:
        unavailable("no Chromium on this machine: `apt-get install chromium` (make setup does it as root where apt "
                    "exists), or point SPECNOISE_CHROMIUM at a Chromium binary")
    try:
        from playwright import sync_api
    except ImportError:
        unavailable("playwright is not installed: pip install -e .[dev]")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri())
            page.wait_for_load_state("load")

            images = page.locator("img")
            assert images.count() == len(list(report.parent.glob("*.png")))
            for i in range(images.count()):
                assert images.nth(i).is_visible()
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")

            results = page.locator("table.data").filter(has=page.locator("th", has_text="lossless_fraction")).first
            visible = results.locator("tbody tr:visible")
            assert visible.count() == 6  # the category filter starts at `all`: 3 jobs x (ar, pld)

            def column(name: str) -> list[str]:
                index = results.locator("th").all_inner_texts().index(name)
                return [row.locator("td").nth(index).get_attribute("data-v") for row in visible.all()]

            before = column("speedup")
            results.locator("th", has_text=re.compile(r"^speedup$")).click()
            after = column("speedup")
            assert after != before and after == sorted(before, key=float)  # ascending
            results.locator("th", has_text=re.compile(r"^speedup$")).click()
            assert column("speedup") == sorted(before, key=float, reverse=True)

            page.select_option('select[name="decoder"]', "pld")
            assert visible.count() == 3 and set(column("decoder")) == {"pld"}
            page.select_option('select[name="model"]', "small-code")
            assert visible.count() == 1
            page.select_option('select[name="category"]', "qa")
            assert column("category") == ["qa"]
            assert results.locator("tbody tr.noisy:visible").count() == 1  # job 1 ran on small-code, noisy
        finally:
            browser.close()
    assert errors == []
