"""NVIDIA GPU nodes without GPUs: node names -> compile-only devices (deviceless compilation).

XLA compiles for an NVIDIA target with no GPU and no CUDA driver present when it is given the
target's description (a GpuTargetConfigProto) instead of asking a device:
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=TEXT,
topology="1x1x8")` gives 8 compile-only devices of one host, and `jit(...).lower(...).compile()`
on a mesh of them runs the whole GPU pipeline (SPMD partitioning, the GPU passes, ptxas). It
needs the CUDA plugin wheels (`pip install 'paxsearch[gpu-plan]'`: jax-cuda12-plugin[with-cuda]
and jax-cuda12-pjrt of the installed jax's version); without them a GPU target is planned
analytically instead (search/planning/targets.py), and `missing_plugin_line` says so in one line.

    node = parse_node("h100x8")          # GpuNode(chip "h100", 8 GPUs)
    devices = node_devices(node)         # 8 compile-only "NVIDIA H100 80GB HBM3" devices

The target description is written here from the chip's figures (trainer/hardware.py: HBM size
and bandwidth) and the architecture facts below (GPU_ARCH, with sources). Importing this module
loads nothing.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass

from ...trainer import hardware
from ...trainer.errors import ConfigError

PLUGIN = "jax_cuda12_plugin"
GPU_PLAN_EXTRA = "pip install 'paxsearch[gpu-plan]'"

_HOPPER = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper (resources.nvidia.com/en-us-tensor-core): "
           "H100 SXM5 132 SMs, 1,980 MHz max boost for the SMs, 50 MB L2, 228 KB shared memory per SM (227 KB "
           "usable by one block), 64K 32-bit registers per SM, 2,048 threads per SM; compute capability 9.0")


@dataclass(frozen=True)
class GpuArch:
    """What XLA's GPU compiler reads of a part besides its memory: SM count and limits."""

    compute_capability: tuple[int, int]
    sm_count: int
    clock_ghz: float
    l2_bytes: int
    shared_per_sm: int
    shared_per_block_optin: int
    source: str


# H200 is H100's die (same SMs and clocks) with 141 GB HBM3e (trainer/hardware.py)
GPU_ARCH = {"h100": GpuArch((9, 0), 132, 1.98, 50 * 2**20, 228 * 1024, 227 * 1024, _HOPPER),
            "h200": GpuArch((9, 0), 132, 1.98, 50 * 2**20, 228 * 1024, 227 * 1024,
                            _HOPPER + "; H200 shares the H100 SXM die (hardware.py 'h200' matmul source)")}
NODE_SIZES = (1, 2, 4, 8)  # GPUs of one NVSwitch node (an A3 / DGX H100 / DGX H200 node has 8)


@dataclass(frozen=True)
class GpuNode:
    """One node of `count` GPUs of one kind, e.g. h100x8."""

    chip: str  # trainer/hardware.py table name: "h100"
    count: int

    @property
    def name(self) -> str:
        return f"{self.chip}x{self.count}"

    @property
    def spec(self) -> hardware.DeviceSpec:
        return hardware.spec(self.chip)


def parse_node(text: str) -> GpuNode:
    """'h100x8' / 'h200x8' (also x1, x2, x4) -> GpuNode; ConfigError (one line) otherwise."""
    m = re.fullmatch(r"\s*([a-z]\d+)\s*x\s*(\d+)\s*", text.lower())
    if not m or m.group(1) not in GPU_ARCH:
        raise ConfigError(f"unknown GPU node {text!r}; use <gpu>x<count> with gpu one of {', '.join(GPU_ARCH)} "
                          "(e.g. h100x8, h200x8)")
    count = int(m.group(2))
    if count not in NODE_SIZES:
        raise ConfigError(f"GPU node {text!r}: {count} GPUs; plan one node of {', '.join(map(str, NODE_SIZES))} "
                          "GPUs (e.g. h100x8)")
    return GpuNode(m.group(1), count)


def has_gpu_hardware() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def plugin_available() -> bool:
    return importlib.util.find_spec(PLUGIN) is not None


def missing_plugin_line(node: GpuNode) -> str:
    """The one line a GPU target without the CUDA plugin gets at planning time."""
    return (f"gpu:{node.name}: XLA cannot compile for NVIDIA GPUs here (the CUDA plugin {PLUGIN} is not "
            f"installed; {GPU_PLAN_EXTRA} enables deviceless compilation): planned analytically "
            "(plan_method analytic: model FLOPs and parameter/optimizer memory, no compile)")


def _cudnn_version() -> tuple[int, int]:
    """The cuDNN the compile assumes: the installed nvidia-cudnn wheel's (what a node with the
    same wheels runs), else 9.8."""
    try:
        major, minor = importlib.metadata.version("nvidia-cudnn-cu12").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 9, 8


def target_config(chip: str) -> str:
    """The GpuTargetConfigProto (text format) of one `chip` GPU, for get_topology_desc."""
    spec, arch = hardware.spec(chip), GPU_ARCH[chip]
    major, minor = arch.compute_capability
    dnn_major, dnn_minor = _cudnn_version()
    info = {"threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 * 1024,
            "shared_memory_per_core": arch.shared_per_sm, "threads_per_core_limit": 2048,
            "core_count": arch.sm_count, "fpus_per_core": 128, "block_dim_limit_x": 2**31 - 1,
            "block_dim_limit_y": 65535, "block_dim_limit_z": 65535,
            "memory_bandwidth": int(spec.hbm_bandwidth.value), "l2_cache_size": arch.l2_bytes,
            "clock_rate_ghz": arch.clock_ghz, "device_memory_size": int(spec.hbm_bytes.value),
            "shared_memory_per_block_optin": arch.shared_per_block_optin, "registers_per_core_limit": 65536,
            "registers_per_block_limit": 65536}
    body = "\n".join(f"  {k}: {v}" for k, v in info.items())
    return (f"gpu_device_info {{\n{body}\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
            f'platform_name: "CUDA"\ndnn_version_info {{ major: {dnn_major} minor: {dnn_minor} }}\n'
            f'device_description_str: "{spec.device_kinds[0]}"\n')


def node_devices(node: GpuNode) -> list:
    """The compile-only devices of one node (call with JAX_PLATFORMS=cpu: no GPU backend starts).
    ConfigError (one line) without the CUDA plugin."""
    if not plugin_available():
        raise ConfigError(missing_plugin_line(node))
    from jax.experimental import topologies

    devices = list(topologies.get_topology_desc(platform="cuda", target_config=target_config(node.chip),
                                                topology=f"1x1x{node.count}").devices)
    if len(devices) != node.count:
        raise ConfigError(f"gpu:{node.name} gave {len(devices)} compile-only devices, expected {node.count}")
    return devices
