"""``python -m resourced.docs [--check]``: write the reference and the man pages into the
source tree, or with ``--check`` only say which are out of date (exit 1)."""

import argparse
import sys
from pathlib import Path

from .build import generate
from .names import REGENERATE

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resourced.docs", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file is missing or out of date")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the source tree (default: the one resourced runs from)")
    args = parser.parse_args(argv)
    if not (args.root / "pyproject.toml").is_file():
        parser.error(f"{args.root} is not resourced's source tree (no pyproject.toml)")
    files = generate()
    stale = [path for path, text in files.items() if _read(args.root / path) != text]
    for directory in sorted({path.parent for path in files}):  # a page no longer made
        if (args.root / directory).is_dir():
            stale += [p.relative_to(args.root) for p in sorted((args.root / directory).iterdir())
                      if p.is_file() and p.relative_to(args.root) not in files]
    if args.check:
        for path in stale:
            print(f"out of date: {path}", file=sys.stderr)
        if stale:
            print(f"regenerate with: {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        target = args.root / path
        if path not in files:
            target.unlink()
            print(f"removed {path}")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
