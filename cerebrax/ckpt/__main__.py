"""``python -m cerebrax.ckpt to-torch|to-h5 SRC DST``: convert checkpoint files."""

from __future__ import annotations

import argparse
import sys

from cerebrax.errors import CheckpointError

from ._torch import convert_h5_to_torch, convert_torch_to_h5

_COMMANDS = {
    "to-torch": (convert_h5_to_torch, "write the H5 checkpoint SRC as a torch file DST"),
    "to-h5": (convert_torch_to_h5, "write the torch file SRC as an H5 checkpoint DST "
              "(read with torch.load(weights_only=True))"),
}


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status (0 ok, 1 failed, 2 usage)."""
    parser = argparse.ArgumentParser(
        prog="python -m cerebrax.ckpt",
        description="Convert between cerebrax H5 checkpoints and torch .pt files.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in _COMMANDS.items():
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("src", metavar="SRC")
        command.add_argument("dst", metavar="DST")
    args = parser.parse_args(argv)
    convert, _ = _COMMANDS[args.command]
    try:
        convert(args.src, args.dst)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
