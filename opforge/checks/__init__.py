"""The checks, one module each (opforge.checks.catalog lists them; opforge.checks.base says what a check is).
Shared helpers: `calls` (calling the op and the reference, failures attributed to the right side)."""
