"""From a validated spec to the op under test: its C++/CUDA sources compiled and cached (`extension`), its modules
imported, the op, its reference and its other implementations resolved and checked against the spec (`op`), and the
op itself as the reference of a spec without one (`self_reference`)."""
