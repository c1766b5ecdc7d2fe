"""Op specs: YAML files loaded into frozen, validated models.

`model` holds the dataclasses and the vocabulary specs are written in; `reader` the YAML reader that keeps every
value's line; `inputs`, `claims`, `xfail` and `bench` one section each (`bytes_expr` the `bench.bytes` expression
language); `load` reads a whole file (load_spec) and finds specs by name (find_spec, list_specs).
"""
