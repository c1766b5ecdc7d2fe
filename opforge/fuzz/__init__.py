"""`opforge fuzz`: search past the spec's matrix for the inputs that break an op, shrink them, keep them."""
