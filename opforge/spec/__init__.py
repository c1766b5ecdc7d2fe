"""The spec model: what a YAML spec says, as frozen, validated models.

`model` holds the dataclasses and the vocabulary specs are written in; `reader` the YAML reader that keeps every
value's line; `inputs`, `claims`, `sources` (the `load:` section) and `bench` one section each (`bytes_expr` the
`bench.bytes` expression language). Reading a whole file (load_spec), and the sections that need the checks' catalog
(`xfail`), are opforge.loading's.
"""
