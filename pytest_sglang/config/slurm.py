"""The profile key `slurm`: a server spread over several nodes of a SLURM cluster (launch/slurm.py runs it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pytest_sglang.errors import ProfileError

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # sbatch's --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
_FIELDS = {
    "nodes": "an integer >= 1: the nodes the server spans, one task on each",
    "gpus_per_node": "an integer >= 0: GPUs asked for on each node (--gpus-per-node)",
    "partition": "a partition name (--partition)",
    "time": "a time limit such as '02:00:00' (--time)",
    "args": "a list of extra srun arguments, e.g. ['--account=ml']",
    "queue_timeout": "seconds the allocation may stay pending before the startup fails (default: startup_timeout)",
}


@dataclass(frozen=True)
class SlurmSpec:
    """What a profile asks SLURM for: one srun step with one task on each of ``nodes`` nodes."""

    nodes: int
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    args: tuple[str, ...] = ()
    queue_timeout: float | None = None

    def as_raw(self) -> dict[str, Any]:
        """The table a child profile merges onto (`extends`)."""
        raw = {k: v for k, v in vars(self).items() if v is not None}
        raw["args"] = list(self.args)
        return raw


def parse_slurm(where: str, table: dict[str, Any]) -> SlurmSpec:
    """Check a profile's `slurm` table; ``where`` names it in errors."""
    def bad(key: str, value: Any) -> ProfileError:
        return ProfileError(f"{where}, slurm.{key}: must be {_FIELDS[key]}, got {value!r}.")

    for key in table:
        if key not in _FIELDS:
            raise ProfileError(f"{where}: unknown key slurm.{key}. Known: {', '.join(_FIELDS)}.")
    nodes = table.get("nodes")
    if nodes is None:
        raise ProfileError(f"{where}: slurm needs `nodes` ({_FIELDS['nodes']}), e.g. slurm = {{ nodes = 2 }}.")
    for key, least in (("nodes", 1), ("gpus_per_node", 0)):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise bad(key, value)
    for key in ("partition", "time"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or value.startswith("-")):
            raise bad(key, value)
    if "time" in table and not _TIME.match(table["time"]):
        raise bad("time", table["time"])
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("args", args)
    queue_timeout = table.get("queue_timeout")
    if queue_timeout is not None and (isinstance(queue_timeout, bool) or not isinstance(queue_timeout, (int, float))
                                      or queue_timeout <= 0):
        raise bad("queue_timeout", queue_timeout)
    return SlurmSpec(nodes=nodes, gpus_per_node=table.get("gpus_per_node"), partition=table.get("partition"),
                     time=table.get("time"), args=tuple(args),
                     queue_timeout=float(queue_timeout) if queue_timeout is not None else None)
