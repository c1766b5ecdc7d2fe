"""One run session for every front end (`session`: the CLI's whole selections, the pytest plugin's tasks one at a
time) and what a run selects beyond the filters (`last_failed`: what `--last-failed` reruns)."""
