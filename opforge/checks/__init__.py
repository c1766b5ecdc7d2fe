"""The checks, one module each (opforge.checks.catalog lists them; opforge.checks.base says what a check is).
Shared helpers: `op_and_reference` (calling an implementation and its reference, comparing them, failures
attributed to the right side)."""
