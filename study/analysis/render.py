"""The report as one list of blocks (headings, paragraphs, warnings, tables, code, images), rendered twice:
Markdown with the images beside it, and a self-contained HTML page with the images embedded as base64."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

import pandas as pd

TABLE_BOX_CLASS = "table-box"
WRAP_CLASS = "wrap"
WRAP_OVER = 40  # characters of a table cell's text from which it wraps instead of widening its column


class Document:
    """One list of blocks (headings, paragraphs, tables, images …), rendered as Markdown and as self-contained HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def warning(self, text: str) -> None:
        self.blocks.append(("warning", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("bullets", items))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(("table", frame))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("image", (path, alt)))

    def markdown(self, base: Path) -> str:
        out = []
        for kind, value in self.blocks:
            if kind == "heading":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "para":
                out.append(value)
            elif kind == "warning":
                out.append(f"> **⚠ {value}**")
            elif kind == "bullets":
                out.append("\n".join(f"- {item}" for item in value))
            elif kind == "table":
                out.append(_md_table(value))
            elif kind == "code":
                out.append(f"```\n{value.rstrip()}\n```")
            elif kind == "image":
                path, alt = value
                out.append(f"![{alt}]({path.relative_to(base).as_posix()})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body = []
        for kind, value in self.blocks:
            if kind == "heading":
                body.append(f"<h{value[0]}>{_inline(value[1])}</h{value[0]}>")
            elif kind == "para":
                body.append(f"<p>{_inline(value)}</p>")
            elif kind == "warning":
                body.append(f'<p class="warning">⚠ {_inline(value)}</p>')
            elif kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in value) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_inline(str(c))}</th>" for c in value.columns)
                rows = "".join("<tr>" + "".join(_cell(str(v)) for v in row) + "</tr>"
                               for row in value.itertuples(index=False))
                # a table wider than the page scrolls inside its own box instead of widening the page
                body.append(f'<div class="{TABLE_BOX_CLASS}"><table><thead><tr>{head}</tr></thead>'
                            f"<tbody>{rows}</tbody></table></div>")
            elif kind == "code":
                body.append(f"<pre>{html.escape(value)}</pre>")
            elif kind == "image":
                path, alt = value
                data = base64.b64encode(path.read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{html.escape(alt)}</figcaption></figure>")
        style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
                 f".{TABLE_BOX_CLASS}{{max-width:100%;overflow-x:auto;margin:1em 0}}"
                 "table{border-collapse:collapse;font-size:0.9em}"
                 # a name, a number or a date stays on one line (a browser would break sasrec-1 at its hyphen);
                 # only long text (lists, notes) wraps, at its spaces
                 "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}"
                 f"td.{WRAP_CLASS}{{white-space:normal;min-width:16em}}th{{background:#f3f3f3}}"
                 "td:first-child,th:first-child{text-align:left}"
                 "pre{background:#f6f6f6;padding:0.8em;overflow-x:auto;font-size:0.85em}"
                 ".warning{background:#fff3cd;border:2px solid #d39e00;padding:0.8em;font-weight:bold}"
                 "img{max-width:100%}figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}"
                 "h1,h2,h3,p,li,figcaption{overflow-wrap:anywhere}")  # long names, paths, code spans break
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
                f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _cell(text: str) -> str:
    """A table cell; long text gets the class that lets it wrap."""
    if len(text) > WRAP_OVER and " " in text:
        return f'<td class="{WRAP_CLASS}">{_inline(text)}</td>'
    return f"<td>{_inline(text)}</td>"


def _inline(text: str) -> str:
    """Escape, then render the little Markdown the report uses: **bold** and `code`."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _md_table(frame: pd.DataFrame) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
