"""What the commands beside check, fuzz and bench compute, each returning data that a reporter renders: `doctor`
(what this machine can build, run and measure), `scaffold` (`opforge new`'s files), `profile` (one op's figures under
the profiler), `merge` (one report from many), `scan` (a namespace's registrations and the specs that cover them) and
`record` (the specs of a recorded program's custom-op calls)."""
