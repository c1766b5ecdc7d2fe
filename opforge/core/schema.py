"""Reading operator schemas as text (`ns::name.overload(Tensor x, float alpha=0.1) -> Tensor`), without torch: the
names of an op's outputs, schemas compared up to alias-set names, which arguments are tensors."""

from __future__ import annotations

import re


def return_names(schema: str) -> tuple[str, ...]:
    """The names an op's outputs go by in messages and `bench.bytes` expressions: `result` for one, the schema's
    names (else result0, result1, ...) for several, none for an op that returns nothing."""
    returns = schema.split("->", 1)[1].strip() if "->" in schema else "()"
    if returns.startswith("("):
        returns = returns[1:-1]
    parts = [p.strip() for p in split_top_level(returns) if p.strip()]
    if len(parts) == 1:
        return ("result",)
    names = []
    for i, part in enumerate(parts):
        words = re.sub(r"\(.*?\)", "", part).split()
        names.append(words[1] if len(words) > 1 else f"result{i}")
    return tuple(names)


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def canonical(schema: object) -> str:
    """The schema after the op name (a spec may leave out the namespace), alias sets renamed in order of first
    appearance: `Tensor(a!)` and torch.library.custom_op's `Tensor(a0!)` mean the same."""
    text = str(schema)
    text = text.split("(", 1)[1] if "(" in text else text
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        alias = names.setdefault(match.group(1), f"alias{len(names)}")
        return f"Tensor({alias}{match.group(2)})"

    return re.sub(r"Tensor\((\w+)(!?)\)", rename, text)


def is_tensor_type(type_: object) -> bool:
    """Whether a schema argument's type is a Tensor (`Tensor`, `Tensor?`, `Tensor(a!)`)."""
    return str(type_).startswith("Tensor")


def mutated_names(schema: str) -> tuple[str, ...]:
    """The arguments the op writes to: `Tensor(a!) out`."""
    arguments = schema.split("(", 1)[1].rsplit("->", 1)[0] if "(" in schema else ""
    arguments = arguments.strip().rstrip(")").strip()
    names = []
    for part in split_top_level(arguments):
        words = part.split("=", 1)[0].split()
        if words and "!" in words[0]:
            names.append(words[-1])
    return tuple(names)
