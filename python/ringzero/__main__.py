"""The `ringzero` command: `ringzero bench ...` (more subcommands as they land)."""
from __future__ import annotations

import sys

COMMANDS = {
    "train": ("ringzero.cli.train", "train the byte-level GPT with one strategy or compare several"),
    "bench": ("ringzero.cli.bench", "collectives microbenchmark against gloo"),
    "estimate": ("ringzero.estimate", "memory per GPU and communication per step of a training plan"),
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items())
        msg = f"usage: ringzero COMMAND [options]\n\ncommands:\n{lines}\n"
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"ringzero: unknown command {argv[0]!r}\n{msg}")
            return 2
        sys.stdout.write(msg)
        return 0
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
