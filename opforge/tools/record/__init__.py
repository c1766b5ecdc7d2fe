"""`opforge record`: custom-op calls recorded from a program, written as specs (docs/record.md)."""
