"""The `opforge` command (its entry point): the commands themselves are in opforge.commands."""

from __future__ import annotations

from opforge.commands import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
