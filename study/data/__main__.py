"""Command line: ``python -m study.data prepare NAME [...]`` and ``python -m study.data list``.

Input problems (a bad name, file, line or flag) are printed as one ``error: ...`` line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from study.data.cache import FORMAT_VERSION, cache_dir, copy_options, list_prepared
from study.data.pipeline import prepare
from study.data.ray_engine import DEFAULT_RAY_ROWS, ENGINES, ROWS_ENV
from study.data.recipes import DEFAULT_RECIPE, RECIPES
from study.errors import UserError

WIDTH = 120  # columns of the longest line ``list`` prints


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip().replace("-", "_"), value.strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.data", description="Prepare and list the datasets of the study."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    prep = commands.add_parser(
        "prepare",
        help="download/read, filter and split a dataset into the cache",
        description="Prepare a dataset (reused from the cache when it already exists). "
        f"Recipes: {', '.join(RECIPES)}.",
    )
    prep.add_argument(
        "name", nargs="?", default=DEFAULT_RECIPE, help=f"recipe name (default {DEFAULT_RECIPE})"
    )
    prep.add_argument("--source", help="local zip, folder or file to read instead of downloading")
    prep.add_argument("--max-len", type=int, default=200, help="longest model input (default 200)")
    prep.add_argument("--kcore", type=int, help="iterative k-core on users and items (default: the recipe's)")
    prep.add_argument("--user-col", help="csv/parquet: user column (default 'user')")
    prep.add_argument("--item-col", help="csv/parquet: item column (default 'item')")
    prep.add_argument(
        "--time-col", help="csv/parquet: time column (default 'timestamp'; 'none' = file order)"
    )
    prep.add_argument("--users", type=int, help="synthetic: number of users")
    prep.add_argument("--items", type=int, help="synthetic: number of items")
    prep.add_argument("--length", type=int, help="synthetic: mean sequence length")
    prep.add_argument("--seed", type=int, help="synthetic: random seed")
    prep.add_argument(
        "--param",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="other recipe option, e.g. --param max_length=4096 --param markov=0.7 (repeatable)",
    )
    prep.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="pandas (one process), ray (Ray Data: local Ray, or the cluster at $RAY_ADDRESS) or auto (default): "
        f"ray above ${ROWS_ENV} source interactions (default {DEFAULT_RAY_ROWS:,}); both give the same dataset",
    )
    prep.add_argument("--force", action="store_true", help="rebuild even if the prepared copy exists")
    prep.add_argument("--quiet", action="store_true", help="no progress output")

    commands.add_parser("list", help="list the recipes and what is in the cache")
    return parser


def _stats_table(path: Path) -> str:
    meta = json.loads((path / "meta.json").read_text())
    length = meta["length"]
    rows = [
        ("dataset", meta["name"]),
        ("users", f"{meta['num_users']:,}"),
        ("items", f"{meta['num_items']:,}"),
        ("interactions", f"{meta['num_interactions']:,}"),
        ("length mean", f"{length['mean']:.1f}"),
        ("length median", f"{length['median']:g}"),
        ("length max", f"{length['max']:,}"),
        ("kcore", str(meta["kcore"])),
        ("max_len", str(meta["max_len"])),
        ("output", str(path)),
    ]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def _cmd_prepare(args: argparse.Namespace) -> None:
    options = {
        key: value
        for key, value in {
            "user_col": args.user_col,
            "item_col": args.item_col,
            "time_col": args.time_col,
            "users": args.users,
            "items": args.items,
            "length": args.length,
            "seed": args.seed,
        }.items()
        if value is not None
    }
    options.update(dict(args.param))
    path = prepare(
        args.name,
        source=args.source,
        max_len=args.max_len,
        kcore=args.kcore,
        force=args.force,
        progress=not args.quiet,
        engine=args.engine,
        **options,
    )
    print(_stats_table(path))


def _fit_path(path: str, room: int) -> str:
    """``path`` in at most ``room`` characters: ``~`` for the home folder, then the middle left out (``...``),
    keeping its start and its file name; meta.json holds it whole."""
    home = str(Path.home())
    if path == home or path.startswith(home + os.sep):
        path = "~" + path[len(home):]
    if len(path) <= room:
        return path
    head = max(1, (room - 3) // 3)
    return f"{path[:head]}...{path[len(path) - (room - 3 - head):]}"


def _wrapped(text: str, indent: int, first: str = "") -> list[str]:
    """``first`` then ``text`` wrapped to :data:`WIDTH` columns, continuation lines indented by ``indent``."""
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * indent, break_on_hyphens=False)


def _source_lines(meta: dict) -> list[str]:
    """Where a prepared dataset came from, each path on a line of its own that fits :data:`WIDTH` columns."""
    source, label = meta.get("source", {}), "      source: "
    if source.get("generator"):
        return [f"{label}generated"]
    if source.get("url"):
        return [f"{label}downloaded from {_fit_path(source['url'], WIDTH - len(label) - 16)}"]
    lines = [label + _fit_path(source.get("path", "?"), WIDTH - len(label))]
    if source.get("kept"):
        kept, cache = Path(source["kept"]), cache_dir()
        shown = f"<cache>/{kept.relative_to(cache)}" if cache in kept.parents else source["kept"]
        lines.append(f"{' ' * len(label)}kept in the cache: {_fit_path(shown, WIDTH - len(label) - 19)}")
    return lines


def _cmd_list() -> None:
    """The recipes, then the prepared datasets; every line fits :data:`WIDTH` columns (long paths are shortened in
    the middle, descriptions wrapped)."""
    print("recipes:")
    width = max(len(name) for name in RECIPES)
    for name, recipe in RECIPES.items():
        origin = "download" if recipe.download else "generated" if recipe.synthetic else "--source"
        first = f"  {name:<{width}}  kcore={recipe.default_kcore}  {origin:<9}  "
        print("\n".join(_wrapped(recipe.description, len(first), first)))
    prepared = list_prepared()
    heading = f"{os.sep}prepared (use them by name: --dataset NAME, dataset: NAME):"
    cache = _fit_path(str(cache_dir()), WIDTH - len("prepared in ") - len(heading))
    if not prepared:
        print(f"nothing prepared in {cache} yet")
        return
    print(f"prepared in {cache}{heading}")
    for path, meta in prepared:
        stale = "" if meta.get("format_version") == FORMAT_VERSION else "  [older format: prepare again]"
        print(f"  {meta.get('name', path.name)}  {path.name}{stale}")
        stats = (f"{meta.get('num_users', 0):,} users, {meta.get('num_items', 0):,} items, "
                 f"{meta.get('num_interactions', 0):,} interactions, mean length "
                 f"{meta.get('length', {}).get('mean', float('nan')):.1f}, kcore {meta.get('kcore')}, "
                 f"windows of {meta.get('max_len')} + 1, prepared {meta.get('created', '?')}{_options_text(meta)}")
        print("\n".join(_wrapped(stats, 6, " " * 6) + _source_lines(meta)))


def _options_text(meta: dict) -> str:
    """The recipe options a prepared copy was read or generated with (a request by name reads its file the same
    way), spelled as a study file's ``dataset.options``."""
    shown = ", ".join(f"{key}={'none' if value is None else value}" for key, value in copy_options(meta).items())
    return f", options {shown}" if shown else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for input problems, shown as one line without a traceback)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            _cmd_prepare(args)
        else:
            _cmd_list()
    except UserError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
