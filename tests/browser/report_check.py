"""Check that ``report.html`` reads well in a real browser: nothing wider than the page, numbers rounded.

    python -m tests.browser.report_check [REPORT_DIR | --make] [--screenshot OUT.png] [--width 1400]

Renders ``REPORT_DIR/report.html`` in headless Chromium at a 1400 px wide viewport (DevTools protocol, see
:mod:`tests.browser.browser`) and checks

* the page does not scroll sideways: ``document.documentElement.scrollWidth <= innerWidth`` (a wide table
  scrolls inside its own box instead; the elements that stick out are named when it fails);
* every table and every image stays inside the page's column;
* no number in a table cell, an image's alt text or a caption has more than 4 significant digits (counts, which
  are exact integers, and version strings are not rounded numbers and are left alone).

Without REPORT_DIR (or with ``--make``) it first builds a report as the tests do: two tiny studies (SASRec and
GRU4Rec on a small synthetic dataset, four searched keys including a log-uniform ``lr`` and a uniform
``dropout``), two replicate seeds of each best configuration, then ``python -m study.report`` over both (a few
minutes on 2 cores). With ``--screenshot`` the viewport is saved as a PNG (``--full-page``: the whole page).
Each check prints one ``ok``/``FAIL`` line; exits 0 when all passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.browser.browser import Browser, BrowserError, Checks

MAX_DIGITS = 4
# a number standing alone: not part of a word (trial ids, hashes), a version (2.13.0) or a longer number
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")

STUDY_YAML = """\
name: {name}
model: {model}
dataset: {{name: synthetic, options: {{users: 300, items: 500, length: 30, seed: 0}}}}
fixed: {{max_len: 20, batch_size: 256}}
search:
  lr: {{loguniform: [3.0e-4, 3.0e-3]}}
  dropout: {{uniform: [0.1, 0.5]}}
  hidden_size: {{choice: [16, 32]}}
  num_layers: {{int: [1, 2]}}
objectives: {{valid_ndcg@10: max}}
sampler: random
budget: {{num_samples: 3, max_epochs: 1}}
scheduler: none
resources: {{cpu: 1, gpu: 0, max_concurrent: 2}}
storage: {storage}
"""

# what the page reports about itself: the widths, what sticks out, the texts whose numbers are checked
MEASURE = """(() => {
  const width = innerWidth;
  const scrolls = box => box !== null && ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
  const sticking = [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > width + 0.5 && !scrolls(e.closest('.table-box')));
  const outermost = sticking.filter(e => !sticking.includes(e.parentElement))
    .map(e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ': '
              + (e.alt || e.textContent || '').trim().slice(0, 60));
  const column = document.body.getBoundingClientRect();
  const escaping = [...document.querySelectorAll('table, img')]
    .filter(e => { const box = e.closest('.table-box');
                   const r = (scrolls(box) ? box : e).getBoundingClientRect();
                   return r.left < column.left - 0.5 || r.right > column.right + 0.5; })
    .map(e => e.tagName.toLowerCase());
  return {scrollWidth: document.documentElement.scrollWidth, innerWidth: width,
          outside: outermost, escaping: escaping,
          tables: document.querySelectorAll('table').length,
          boxed: [...document.querySelectorAll('.table-box > table')].filter(t => scrolls(t.parentElement)).length,
          scrolling: [...document.querySelectorAll('.table-box')]
                     .filter(b => scrolls(b) && b.scrollWidth > b.clientWidth).length,
          images: document.querySelectorAll('img').length,
          texts: [...document.querySelectorAll('th, td')].map(e => e.innerText)
                 .concat([...document.querySelectorAll('img')].map(e => e.alt))
                 .concat([...document.querySelectorAll('figcaption')].map(e => e.innerText))};
})()"""


def significant_digits(number: str) -> int:
    """Significant digits of a decimal number as printed: ``0.001235`` → 4, ``0.1000`` → 4, ``1.235e-07`` → 4."""
    mantissa = number.lstrip("+-−").split("e")[0].replace(",", "")
    return len(mantissa.replace(".", "").lstrip("0"))


def overlong_numbers(texts: list[str], max_digits: int = MAX_DIGITS) -> list[str]:
    """The rounded numbers (with a decimal point or an exponent) among ``texts`` that print too many digits."""
    found = []
    for text in texts:
        for number in NUMBER.findall(text):
            if ("." in number or "e" in number) and significant_digits(number) > max_digits:
                found.append(f"{number} (in {text.strip()[:60]!r})")
    return found


def make_report(root: Path) -> Path:
    """Two tiny synthetic studies, two replicate seeds each, and their report; returns the report folder."""
    from study.cluster import LOCAL, choose_auth_mode

    choose_auth_mode(LOCAL)  # before Ray is imported, as the commands do: Ray then starts without a warning
    import ray

    from study import replicate, report, sweep
    from study.cluster import start_ray

    os.environ["SEQREC_DATA"] = str(root / "cache")  # never the user's cache
    folders = []
    start_ray(LOCAL, num_cpus=2, quiet=True)  # one Ray for both studies and their replicates
    try:
        for model in ("sasrec", "gru4rec"):
            folder = root / "results" / f"synthetic-{model}"
            spec = root / f"{model}.yaml"
            spec.write_text(STUDY_YAML.format(name=folder.name, model=model, storage=folder))
            if sweep.main([str(spec), "--quiet"]) != 0:
                raise RuntimeError(f"the {model} sweep failed")
            if replicate.main([str(folder), "--seeds", "2", "--select", "top:1", "--quiet"]) != 0:
                raise RuntimeError(f"replicating the {model} study failed")
            folders.append(folder)
    finally:
        ray.shutdown()
    out = root / "report"
    if report.main([str(f) for f in folders] + ["--out", str(out)]) != 0:
        raise RuntimeError("python -m study.report failed")
    return out


async def measure(page: Path, width: int, screenshot: Path | None, full_page: bool) -> dict[str, Any]:
    async with Browser(width=width, height=1000) as browser:
        await browser.open(page.resolve().as_uri(), settle_s=0.5)
        measured = await browser.evaluate(MEASURE)
        if screenshot is not None:
            await browser.screenshot(screenshot, full_page=full_page)
    return measured


def check_report(page: Path, width: int, screenshot: Path | None, full_page: bool) -> int:
    check = Checks()
    try:
        m = asyncio.run(measure(page, width, screenshot, full_page))
    except BrowserError as error:
        check(False, f"headless Chromium rendered {page}: {error}")
        return 1
    check(m["scrollWidth"] <= m["innerWidth"],
          f"no sideways scrolling at {width} px: scrollWidth {m['scrollWidth']} <= innerWidth {m['innerWidth']}")
    check(not m["outside"], f"no element outside the viewport ({len(m['outside'])} found"
                            + (f": {'; '.join(m['outside'][:5])})" if m["outside"] else ")"))
    check(m["tables"] > 0 and m["boxed"] == m["tables"],
          f"every table inside a box that scrolls sideways ({m['boxed']} of {m['tables']}; "
          f"{m['scrolling']} scroll inside it)")
    check(not m["escaping"], f"every table and image ({m['images']} images) within the page's column"
                             + (f" ({len(m['escaping'])} escape: {', '.join(m['escaping'][:5])})"
                                if m["escaping"] else ""))
    long = overlong_numbers(m["texts"])
    check(not long, f"no number with more than {MAX_DIGITS} significant digits in {len(m['texts'])} table cells, "
                    f"alt texts and captions" + (f": {'; '.join(long[:5])}" if long else ""))
    if screenshot is not None:
        check(screenshot.is_file() and screenshot.stat().st_size > 10_000, f"screenshot: {screenshot}")
    print("all checks passed" if not check.failed else f"{check.failed} check(s) failed")
    return 1 if check.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser.report_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, help="a report folder (holding report.html) or the file")
    parser.add_argument("--make", action="store_true", help="build a report from two tiny synthetic studies first")
    parser.add_argument("--screenshot", type=Path, help="PNG of the rendered page")
    parser.add_argument("--full-page", action="store_true", help="the screenshot holds the whole page")
    parser.add_argument("--width", type=int, default=1400, help="viewport width in px (default %(default)s)")
    args = parser.parse_args(argv)
    if args.report is not None and args.make:
        parser.error("give a REPORT_DIR or --make, not both")
    if args.report is None:
        with tempfile.TemporaryDirectory(prefix="report-check-") as tmp:
            out = make_report(Path(tmp))
            return check_report(out / "report.html", args.width, args.screenshot, args.full_page)
    page = args.report / "report.html" if args.report.is_dir() else args.report
    if not page.is_file():
        parser.error(f"{page}: no such file")
    return check_report(page, args.width, args.screenshot, args.full_page)


if __name__ == "__main__":
    sys.exit(main())
