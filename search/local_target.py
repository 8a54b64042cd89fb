"""Targets a trial runs on, for now only local CPU devices: "cpu:N" (N simulated devices).

(TPU topologies are planned through search/targets.py when it lands; this module keeps the
one target the local worker runs today.)
"""
from __future__ import annotations

import re
from dataclasses import dataclass


class TargetError(ValueError):
    """The target text cannot be used."""


@dataclass(frozen=True)
class Target:
    platform: str  # "cpu"
    num_devices: int  # devices of one trial, all processes together
    text: str

    def devices_per_process(self, processes: int) -> int:
        if processes < 1 or self.num_devices % processes:
            raise TargetError(f"target {self.text} has {self.num_devices} devices, which do not split over "
                              f"{processes} processes; use a process count dividing {self.num_devices}")
        return self.num_devices // processes


def parse_target(text: str) -> Target:
    m = re.fullmatch(r"\s*cpu\s*:\s*([0-9]+)\s*", str(text))
    if not m or int(m.group(1)) < 1:
        raise TargetError(f"unknown target {text!r}; use cpu:N (N simulated CPU devices, e.g. cpu:8)")
    return Target("cpu", int(m.group(1)), f"cpu:{int(m.group(1))}")
