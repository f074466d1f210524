"""``rlx ls``: the registered components, their hyperparameters and the defaults their YAML sets."""

from __future__ import annotations

import yaml
from rich.console import Console
from rich.table import Table

from rlx_cli.config import signatures
from rlx_cli.config.compose import conf_dir
from rlx_cli.config.errors import UserError


def yaml_block(group: str, name: str) -> dict:
    path = conf_dir() / group / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def print_components(group: str | None) -> None:
    table = signatures.table()  # read from the source: listing imports no torch
    if group is not None and group not in table:
        raise UserError(f"unknown component group '{group}' (valid: {', '.join(sorted(table))})")
    rows = Table(show_lines=False)
    for column in ("group", "name", "hyperparameters (YAML value; function default where they differ)", "source"):
        rows.add_column(column)
    for g in [group] if group else sorted(table):
        for name, signature in sorted(table[g].items()):
            defaults = signature.hyperparameters
            block = {k: v for k, v in yaml_block(g, name).items() if k != "name"}
            shown = []
            for key in dict.fromkeys([*block, *defaults]):
                value = block.get(key, defaults.get(key))
                note = f" (fn: {defaults[key]})" if key in block and key in defaults and defaults[key] != value else ""
                shown.append(f"{key}={value}{note}")
            rows.add_row(g, name, ", ".join(shown), signature.source)
    Console().print(rows)
