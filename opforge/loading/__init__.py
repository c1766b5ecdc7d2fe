"""Loading a spec, above the checks (which checks and spec sections it may name come from their catalog): a whole spec
file read and validated (`spec`: load_spec; also where specs are found), its `xfail:` list (`xfail`) and its kept
`regressions:` cases (`regressions`), and the op of a loaded spec built, loaded and its claims validated by every
check (`checked`: load_checked)."""
