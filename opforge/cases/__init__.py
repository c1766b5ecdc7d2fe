"""The cases of a run: the test matrix of a spec (`matrix`), each case's inputs (`arguments`), and how an op's results
compare with the reference's (`compare`: tolerances, the low-precision rule, the worst mismatch)."""
