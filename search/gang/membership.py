"""Who is in a slice gang: the coordinator, the number of hosts and this host's index.

`paxsearch worker` on every host of a slice forms one gang. Membership is given on the
command line (`--coordinator HOST:PORT --num-hosts N --host-index I`) or read from where
the job was started, with the conventions jax.distributed itself uses
(jax/_src/clusters/*.py), so that the same command runs under each launcher:

- SLURM (`srun`): reads SLURM_JOB_ID, SLURM_NTASKS, SLURM_PROCID, SLURM_STEP_NODELIST;
  coordinator: the first node, port 61440 + job id mod 4096.
- GKE / JobSet (XPK): reads TPU_WORKER_ID, TPU_WORKER_HOSTNAMES (or TPU_PROCESS_ADDRESSES),
  MEGASCALE_* for several slices; coordinator: MEGASCALE_COORDINATOR_ADDRESS, else the first
  worker, port 8482.
- Cloud TPU VM (`gcloud ... ssh --worker=all`): reads the VM's metadata server
  (`agent-worker-number`, `worker-network-endpoints`); coordinator: the first worker, port 8482.

The metadata server is asked only on a machine with TPU device files (/dev/accel*,
/dev/vfio/<n>) or when GCE_METADATA_IP names it (as JAX and google-auth read it), with a
short timeout. JAX-free, no third-party imports.
"""
from __future__ import annotations

import glob
import os
import re
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import UserError

TPU_COORDINATOR_PORT = 8482  # jax/_src/clusters/cloud_tpu_cluster.py
METADATA_TIMEOUT_S = 5.0


class MembershipError(UserError, ValueError):
    """Gang membership cannot be worked out (one line for the user)."""


@dataclass(frozen=True)
class Membership:
    coordinator: str  # "host:port" of host 0, where jax.distributed's coordinator listens
    num_hosts: int
    host_index: int
    source: str  # "command line", "SLURM", "GKE", "Cloud TPU metadata"

    @property
    def leader(self) -> bool:
        return self.host_index == 0

    def describe(self) -> str:
        return (f"host {self.host_index} of {self.num_hosts} in the slice gang at {self.coordinator} "
                f"({self.source})")


def check_address(text: str) -> str:
    m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", text.strip())
    if not m or not 0 < int(m.group(2)) < 65536:
        raise MembershipError(f"--coordinator {text!r} is not HOST:PORT (e.g. 10.0.0.2:8482)")
    return text.strip()


def _checked(coordinator: str, num_hosts: int, host_index: int, source: str) -> Membership:
    if num_hosts < 1:
        raise MembershipError(f"{source}: the number of hosts is {num_hosts}; it must be >= 1")
    if not 0 <= host_index < num_hosts:
        raise MembershipError(f"{source}: host index {host_index} is not in [0, {num_hosts - 1}]")
    return Membership(check_address(coordinator), num_hosts, host_index, source)


def explicit(coordinator: str | None, num_hosts: int | None, host_index: int | None) -> Membership | None:
    given = {"--coordinator": coordinator, "--num-hosts": num_hosts, "--host-index": host_index}
    if all(v is None for v in given.values()):
        return None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise MembershipError(f"a slice gang given on the command line needs --coordinator, --num-hosts and "
                              f"--host-index; missing {', '.join(missing)}")
    return _checked(coordinator, int(num_hosts), int(host_index), "command line")


def _int(env: Mapping[str, str], key: str, source: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise MembershipError(f"{source}: {key}={env[key]!r} is not a number") from None


def first_slurm_node(node_list: str) -> str:
    """'node[001-004,9],gpu7' -> 'node001'; 'a,b' -> 'a'."""
    head = re.split(r",(?![^\[]*\])", node_list.strip())[0]
    m = re.fullmatch(r"([^\[]*)\[([^\],-]+)[^\]]*\](.*)", head)
    return f"{m.group(1)}{m.group(2)}{m.group(3)}" if m else head


def from_slurm(env: Mapping[str, str]) -> Membership | None:
    keys = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_STEP_NODELIST")
    if not all(k in env for k in keys):
        return None
    port = _int(env, "SLURM_JOB_ID", "SLURM") % 4096 + 65536 - 4096
    return _checked(f"{first_slurm_node(env['SLURM_STEP_NODELIST'])}:{port}", _int(env, "SLURM_NTASKS", "SLURM"),
                    _int(env, "SLURM_PROCID", "SLURM"), "SLURM")


def _tpu_membership(workers: list[str], index: int, env: Mapping[str, str], source: str) -> Membership:
    """One slice's worker list and this worker's index in it; MEGASCALE_* for several slices."""
    workers = [w.strip() for w in workers if w.strip()]
    if not workers:
        raise MembershipError(f"{source}: the worker list is empty")
    slices = int(env.get("MEGASCALE_NUM_SLICES") or 1)
    slice_id = int(env.get("MEGASCALE_SLICE_ID") or 0)
    coordinator = (env.get("MEGASCALE_COORDINATOR_ADDRESS") or workers[0]).split(":")[0]
    return _checked(f"{coordinator}:{TPU_COORDINATOR_PORT}", len(workers) * slices,
                    index + slice_id * len(workers), source)


def from_gke(env: Mapping[str, str], tpu_machine: bool | None = None) -> Membership | None:
    """Only on a machine with TPUs (as jax's GkeTpuCluster): the same variables are set, with
    one host, for compile-only TPU topologies on a CPU (search/planning/topology.compile_only_env)."""
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
    if not hosts or "TPU_WORKER_ID" not in env or not (on_tpu_vm() if tpu_machine is None else tpu_machine):
        return None
    workers = hosts.split(",")
    if len(workers) == 1 and int(env.get("MEGASCALE_NUM_SLICES") or 1) == 1:
        return None  # one host works alone
    return _tpu_membership(workers, _int(env, "TPU_WORKER_ID", "GKE"), env, "GKE")


def metadata_getter(env: Mapping[str, str]) -> Callable[[str], str | None]:
    """GET computeMetadata/v1/instance/attributes/KEY of the VM's metadata server (None: no answer)."""
    host = env.get("GCE_METADATA_IP", "metadata.google.internal")

    def get(key: str) -> str | None:
        req = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
                                     headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=METADATA_TIMEOUT_S) as r:
                return r.read().decode() if r.status == 200 else None
        except OSError:
            return None

    return get


def on_tpu_vm() -> bool:
    return bool(glob.glob("/dev/accel*") or [p for p in glob.glob("/dev/vfio/*") if p.split("/")[-1].isdigit()])


def from_cloud_tpu(env: Mapping[str, str], tpu_machine: bool | None = None,
                   get: Callable[[str], str | None] | None = None) -> Membership | None:
    if get is None:
        tpu = on_tpu_vm() if tpu_machine is None else tpu_machine
        if env.get("TPU_SKIP_MDS_QUERY") is not None or not ("GCE_METADATA_IP" in env or tpu):
            return None
        get = metadata_getter(env)
    number = get("agent-worker-number")
    endpoints = get("worker-network-endpoints")
    if number is None or endpoints is None:
        return None
    workers = []
    for entry in endpoints.split(","):  # "host" or the older "name:id:ip"
        parts = entry.strip().split(":")
        if len(parts) not in (1, 3):
            raise MembershipError(f"Cloud TPU metadata: unsupported worker-network-endpoints entry {entry!r}")
        workers.append(parts[-1])
    try:
        index = int(number.strip())
    except ValueError:
        raise MembershipError(f"Cloud TPU metadata: agent-worker-number {number!r} is not a number") from None
    return _tpu_membership(workers, index, env, "Cloud TPU metadata")


def resolve(coordinator: str | None = None, num_hosts: int | None = None, host_index: int | None = None,
            env: Mapping[str, str] | None = None, detect: bool = True,
            tpu_machine: bool | None = None) -> Membership | None:
    """The gang this process belongs to: the command line's, else the launcher's (when
    `detect`); None when this host works alone (one host, or nothing to detect).
    `tpu_machine`: whether this machine has TPUs (None: look for their device files)."""
    env = os.environ if env is None else env
    found = explicit(coordinator, num_hosts, host_index)
    if found is None and detect:
        found = (from_slurm(env) or from_gke(env, tpu_machine) or from_cloud_tpu(env, tpu_machine))
    if found is None or found.num_hosts == 1:
        return None
    return found
