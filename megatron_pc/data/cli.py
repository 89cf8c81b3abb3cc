"""``megatron-pc data``: look at a data file as training will read it, or convert it to our .jsonl.

    megatron-pc data inspect FILE [--format F]
    megatron-pc data convert FILE --format F --out OUT.jsonl [--no-progress]
"""

from __future__ import annotations

import argparse

from megatron_pc.data.formats import AUTO, FORMATS

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    formats = [AUTO, *FORMATS]
    parser = argparse.ArgumentParser(prog="megatron-pc data", description="Inspect or convert prompt data files (.parquet, .jsonl).")
    sub = parser.add_subparsers(dest="action", required=True)
    inspect = sub.add_parser("inspect", help="format, rows, fields, examples, answer types and every problem of a file")
    inspect.add_argument("file")
    inspect.add_argument("--format", default=AUTO, choices=formats, help="the file's format (default: detected from its columns)")
    inspect.add_argument("--examples", type=int, default=3, help="example records to show (default 3)")
    convert = sub.add_parser("convert", help="write a file of any known format as our .jsonl (nothing is written on error)")
    convert.add_argument("file")
    convert.add_argument("--format", default=AUTO, choices=formats, help="the file's format (default: detected from its columns)")
    convert.add_argument("--out", required=True, help="the .jsonl file to write")
    convert.add_argument("--no-progress", action="store_true", help="no progress bar (shown for large files)")
    return parser


def main(argv: list[str]) -> int:
    """Run one action; ``inspect`` exits 1 when the file has problems, a bad file exits 2."""
    args = _parser().parse_args(argv)
    if args.action == "inspect":
        from megatron_pc.data.inspect import inspect_file, render

        found = inspect_file(args.file, args.format, args.examples)
        print(render(found))
        return 1 if found.problems else 0
    from megatron_pc.data.convert import convert_to_jsonl

    written = convert_to_jsonl(args.file, args.format, args.out, progress=not args.no_progress)
    print(f"wrote {written} records to {args.out}")
    return 0
