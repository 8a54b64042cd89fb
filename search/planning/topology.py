"""TPU slices without TPUs: chip figures (a view of trainer/hardware.py), slice names -> topologies,
compile-only devices, and the typed failure for a step that cannot fit in HBM.

A slice is named the way Google Cloud names accelerator types: "v5e-16", "v6e-256" count
chips; "v4-32", "v5p-128" count TensorCores (2 per chip, one JAX device per chip in
megacore mode). `slice_topology("v5p-128")` gives the topology name that
`jax.experimental.topologies.get_topology_desc` takes ("v5p:4x4x4", 64 chips), and
`topology_devices("v5e-16", num_slices=2)` the compile-only devices of two such slices
joined by the data-center network (each device carries its `slice_index`, so
trainer.mesh.build_mesh lays DCN axes across slices with create_hybrid_device_mesh).

libtpu is an optional extra (`pip install 'paxsearch[tpu]'`); without it a TPU target fails
with one line (LibtpuMissing). Loading libtpu on a machine without TPUs makes it ask the
GCE metadata server and print warnings; we tell it what it asks for instead (see
_quiet_libtpu_env), so compile-only runs stay quiet. Importing this module loads nothing.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import math
import os
import re
from dataclasses import dataclass

from ...trainer import hardware
from ...trainer.compile_cache import no_persistent_cache_writes
from ...trainer.errors import ConfigError, TrainerError

GiB = 1024 ** 3
LIBTPU_MISSING = "TPU targets need libtpu: pip install 'paxsearch[tpu]'"


class LibtpuMissing(TrainerError, ImportError):
    """A TPU target was asked for but libtpu is not installed."""

    def __init__(self, message: str = LIBTPU_MISSING):
        super().__init__(message)


class PredictedOOM(TrainerError):
    """The step cannot fit in the target's HBM: either XLA's TPU compiler refused it
    (RESOURCE_EXHAUSTED, CompileTimeHbmOom) or its compiled peak exceeds the HBM.

    required_bytes / available_bytes: per device, None when the compiler did not say.
    source: "compiler" (the compiler refused), "memory_analysis" (compiled, too big) or
    "analytic" (parameters + optimizer state alone exceed HBM; nothing was compiled).
    plan_method: how the refused plan was being made ("hlo_passes", "compiled"), where a plan
    of a target set it (search/planning/compilation.py).
    """

    def __init__(self, message: str, required_bytes: int | None = None,
                 available_bytes: int | None = None, source: str = "compiler"):
        super().__init__(message)
        self.required_bytes = required_bytes
        self.available_bytes = available_bytes
        self.source = source
        self.plan_method: str | None = None

    def to_dict(self) -> dict:
        return {"message": str(self), "required_bytes": self.required_bytes,
                "available_bytes": self.available_bytes, "source": self.source}


@dataclass(frozen=True)
class ChipSpec:
    """One TPU chip (= one JAX device in megacore mode), a view of its trainer/hardware.py
    entry plus its slice naming. Bandwidths in bytes/s."""

    name: str  # "v5e"
    device_kinds: tuple[str, ...]  # jax Device.device_kind spellings
    peak_bf16_flops: float
    hbm_bytes: int  # what XLA's TPU compiler lets a program use (hardware: hbm_usable_bytes)
    hbm_bytes_nominal: int  # the product page's HBM capacity
    hbm_bandwidth: float
    ici_bandwidth_per_chip: float  # bidirectional, all ports together
    ici_ports: int
    dcn_bandwidth_per_chip: float  # data-center network egress, the chip's share
    torus_dims: int  # 2 (v5e, v6e) or 3 (v4, v5p)
    cores_per_chip: int  # TensorCores: slice names of v4 / v5p count these
    accelerator_prefix: str  # Cloud accelerator type: "<prefix>-<count>"
    chip_config_name: str | None  # get_topology_desc(chip_config_name=...), as on live hosts
    sources: tuple[str, ...]

    @property
    def ici_link_bandwidth(self) -> float:
        """One direction of one ICI link."""
        return self.ici_bandwidth_per_chip / self.ici_ports / 2


# Slice naming per chip (not hardware figures): the Cloud accelerator-type prefix and the
# chip_config_name that live hosts pass to get_topology_desc.
_SLICE_NAMING = {"v4": ("v4", "megacore"), "v5e": ("v5litepod", None), "v5p": ("v5p", "megachip_tccontrol"),
                 "v6e": ("v6e", "megachip_tccontrol")}


def _chip(entry: hardware.DeviceSpec) -> ChipSpec:
    """The ChipSpec view of one TPU entry of trainer/hardware.py (figures and sources there)."""
    prefix, chip_config = _SLICE_NAMING[entry.name]
    return ChipSpec(entry.name, entry.device_kinds, entry.peak_bf16_flops.value, int(entry.hbm_usable_bytes.value),
                    int(entry.hbm_bytes.value), entry.hbm_bandwidth.value, entry.ici_bandwidth.value,
                    int(entry.ici_ports.value), entry.dcn_bandwidth.value, int(entry.torus_dims.value),
                    int(entry.cores_per_chip.value), prefix, chip_config, entry.sources())


HOST_CHIPS = 4  # chips of the smallest multi-chip TPU host (2x2x1), what libtpu assumes by default
CHIPS: dict[str, ChipSpec] = {name: _chip(hardware.spec(name)) for name in _SLICE_NAMING}
# usable HBM per chip: what XLA's TPU compiler lets a program use (hardware.py says how measured)
HBM_USABLE = {name: chip.hbm_bytes for name, chip in CHIPS.items()}

# Supported slice shapes (chips), from the same pages.
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
              256: (16, 16)}
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
              256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16),
              6144: (16, 16, 24)}


@dataclass(frozen=True)
class TpuSlice:
    """One named slice, e.g. v5e-16 -> 16 chips in topology v5e:4x4."""

    name: str  # "v5e-16"
    chip: ChipSpec
    chips: int
    shape: tuple[int, ...]  # chips per torus dimension

    @property
    def base_name(self) -> str:
        """The name without a chosen topology: 'v5p-1024' for 'v5p-1024@4x8x16'."""
        return self.name.partition("@")[0]

    @property
    def chosen_topology(self) -> str:
        """'4x8x16' for 'v5p-1024@4x8x16'; '' for a slice in its usual topology."""
        return self.name.partition("@")[2]

    @property
    def topology_name(self) -> str:
        return f"{self.chip.name}:" + "x".join(str(s) for s in self.shape)

    @property
    def accelerator_type(self) -> str:
        return f"{self.chip.accelerator_prefix}-{self.chips * self.chip.cores_per_chip}"

    @property
    def wrap(self) -> tuple[bool, bool, bool]:
        """Which torus dimensions have wraparound links (torus_wrap)."""
        return torus_wrap(self.chip, self.shape)

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int] | None:
        """The chips of one host, for a slice smaller than a host (v5e-1: (1, 1, 1)); None
        otherwise. libtpu 0.0.42.1 assumes hosts of 2x2x1 chips and refuses a compile-only
        "v5e:1x1" ("not divisible by the given (or default) chips_per_host_bounds 2x2x1");
        the project's v5e chip sets TPU_CHIPS_PER_HOST_BOUNDS itself."""
        if self.chips >= HOST_CHIPS:
            return None
        return tuple((list(self.shape) + [1, 1, 1])[:3])  # type: ignore[return-value]


def torus_wrap(chip: ChipSpec, shape: tuple[int, ...]) -> tuple[bool, bool, bool]:
    """Which torus dimensions of a slice of `chip` shaped `shape` (chips per dimension) have
    wraparound links, as the hardware has them and get_topology_desc(wrap=...) takes them (three
    entries; live hosts know them from the machine). v4 and v5p: slices of 64 chips or more (every
    dimension a multiple of 4) are tori in all three dimensions; smaller ones are open meshes. v5e
    and v6e: a dimension of 16 chips (the whole pod's edge) wraps, shorter ones do not (v5e-256:
    both; v5e-128, 8x16: the 16). Without wraparound the compiler plans each ring over that axis
    as an open line: the same program then keeps its windowed-einsum permutes synchronous
    (RESULTS.md, "v5e-256 128B"), and a ring collective along it runs one way on each link (the
    roofline, search/planning/roofline/collectives.py)."""
    if chip.torus_dims == 3:
        full = math.prod(shape) >= 64 and all(d % 4 == 0 for d in shape)
        return (full, full, full)
    return (shape[0] == 16, shape[1] == 16, False)


def chip_for_device_kind(device_kind: str) -> ChipSpec | None:
    kind = device_kind.lower()
    for chip in sorted(CHIPS.values(), key=lambda c: -max(len(k) for k in c.device_kinds)):
        if any(k.lower() == kind for k in chip.device_kinds):
            return chip
    return None


def parse_slice(name: str) -> TpuSlice:
    """'v5e-16' / 'v5p-128' / 'v4-32' / 'v6e-256' -> TpuSlice; ConfigError when unknown.
    A v4 or v5p slice of 64 chips or more may name another of its topologies after '@':
    'v5p-1024@4x8x16' (Cloud TPU builds these slices of 4x4x4 cubes, and `--topology` chooses
    the shape; the topology decides which mesh axes get a ring of their own: jax's
    create_device_mesh lays an axis of 16 on 8x8x8 only by splitting a dimension, with
    allow_split_physical_axes, and on 4x8x16 on one). The default topology drops the suffix."""
    m = re.fullmatch(r"\s*(v4|v5e|v5litepod|v5p|v6e)-(\d+)(?:@(\S+))?\s*", name.lower())
    if not m:
        raise ConfigError(f"unknown TPU slice {name!r}; use <chip>-<count> with chip one of "
                          f"{', '.join(CHIPS)} (e.g. v5e-16, v5p-128, v4-32, v6e-256, v5p-1024@4x8x16)")
    chip = CHIPS["v5e" if m.group(1) == "v5litepod" else m.group(1)]
    count = int(m.group(2))
    if count % chip.cores_per_chip:
        raise ConfigError(f"{name}: {chip.name} slice names count TensorCores ({chip.cores_per_chip} per chip); "
                          f"use an even count such as {chip.name}-{2 * max(count // 2, 4)}")
    chips = count // chip.cores_per_chip
    shapes = _SHAPES_3D if chip.torus_dims == 3 else _SHAPES_2D
    if chips not in shapes:
        sizes = ", ".join(f"{chip.name}-{c * chip.cores_per_chip}" for c in shapes)
        raise ConfigError(f"{name}: no {chip.name} slice of {chips} chips; supported: {sizes}")
    base = f"{chip.name}-{count}"
    shape: tuple[int, ...] = shapes[chips]
    if m.group(3):
        shape = _chosen_topology(base, chip, chips, shape, m.group(3))
    return TpuSlice(base + ("" if shape == shapes[chips] else "@" + "x".join(map(str, shape))), chip, chips, shape)


def _chosen_topology(base: str, chip: ChipSpec, chips: int, default: tuple[int, ...],
                     text: str) -> tuple[int, ...]:
    """The shape of 'AxBxC' for slice `base`, or ConfigError naming what is wrong."""
    usual = "x".join(map(str, default))
    if chip.torus_dims != 3:
        raise ConfigError(f"{base}@{text}: a {chip.name} slice has one topology per size ({usual}); other "
                          f"topologies are chosen for v4 and v5p slices (e.g. v5p-1024@4x8x16)")
    dm = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if not dm:
        raise ConfigError(f"{base}@{text}: a topology is three chip counts AxBxC (e.g. {base}@{usual})")
    shape = tuple(int(d) for d in dm.groups())
    if math.prod(shape) != chips:
        raise ConfigError(f"{base}@{text}: {text} holds {math.prod(shape)} chips, {base} has {chips} "
                          f"(its usual topology is {usual})")
    if shape != default and (chips < 64 or any(d % 4 for d in shape)):
        raise ConfigError(f"{base}@{text}: slices of 64 chips or more are built of 4x4x4 cubes, so each "
                          f"dimension is a multiple of 4; smaller slices have one topology ({usual} here)")
    return shape


def slice_topology(name: str) -> str:
    """'v5e-16' -> 'v5e:4x4'; 'v5p-128' -> 'v5p:4x4x4'; 'v4-32' -> 'v4:2x2x4'."""
    return parse_slice(name).topology_name


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    if not libtpu_available():
        raise LibtpuMissing()


def has_tpu_hardware(dev: str = "/dev") -> bool:
    """TPU chips are attached: /dev/accel<N> (TPU VMs of v4 and older) or a numbered VFIO group
    /dev/vfio/<N> (v5e and newer; N is not always 0: the project's v5e chip is /dev/vfio/3)."""
    return bool(glob.glob(os.path.join(dev, "accel[0-9]*")) or glob.glob(os.path.join(dev, "vfio", "[0-9]*")))


def _quiet_libtpu_env(tpu_slice: TpuSlice) -> None:
    """On a machine without TPUs libtpu asks the GCE metadata server for the accelerator
    type and worker hostnames and warns when it gets no answer. Tell it instead: skip the
    metadata query (what JAX itself sets when it finds no TPU chips), the accelerator type
    of the target, and this host as the only worker. libtpu also takes a lock file so that
    one process owns the TPU chips; with no chips to own, compile-only processes may load
    it side by side (parallel plan workers). Existing settings are kept."""
    if has_tpu_hardware():
        return
    for key, value in compile_only_env(tpu_slice).items():
        os.environ.setdefault(key, value)


def compile_only_env(tpu_slice: TpuSlice) -> dict[str, str]:
    """Environment for loading libtpu only to compile for `tpu_slice` (no TPU hardware)."""
    return {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": tpu_slice.accelerator_type,
            "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def topology_devices(name: str, num_slices: int = 1) -> list:
    """Compile-only devices of `num_slices` slices `name` (e.g. 'v5e-16'), in the order
    get_topology_desc gives them. With num_slices > 1 every device has a `slice_index`."""
    tpu_slice = parse_slice(name)
    if num_slices < 1:
        raise ConfigError(f"num_slices must be >= 1, got {num_slices}")
    require_libtpu()
    _quiet_libtpu_env(tpu_slice)
    from jax.experimental import topologies

    kwargs: dict[str, str | int | tuple[bool, ...] | tuple[int, ...]] = {"wrap": tpu_slice.wrap}
    if tpu_slice.chip.chip_config_name:
        kwargs["chip_config_name"] = tpu_slice.chip.chip_config_name
    if num_slices > 1:
        kwargs["num_slices"] = num_slices
    if tpu_slice.chips_per_host_bounds:
        kwargs["chips_per_host_bounds"] = tpu_slice.chips_per_host_bounds
    devices = list(topologies.get_topology_desc(tpu_slice.topology_name, "tpu", **kwargs).devices)
    expected = tpu_slice.chips * num_slices
    if len(devices) != expected:
        raise ConfigError(f"{name} x {num_slices} slices gave {len(devices)} devices, expected {expected}")
    _libtpu_reads_no_cpu_flags(devices[0])
    return devices


CPU_FLAG_PREFIX = "--xla_cpu_"
_libtpu_flags_read = False


def without_cpu_flags(xla_flags: str) -> str:
    """An XLA_FLAGS value without XLA:CPU's own flags (--xla_cpu_*)."""
    return " ".join(f for f in xla_flags.split() if not f.startswith(CPU_FLAG_PREFIX))


def _libtpu_reads_no_cpu_flags(device) -> None:
    """libtpu compiles with its own copy of XLA, which parses XLA_FLAGS once, at its first
    compile, and exits on a flag it does not know. XLA:CPU's own flags (--xla_cpu_*: the
    simulated devices' collective timeout, a code-generation choice) mean nothing to a TPU
    compile, and a newer jaxlib's may be unknown to libtpu (libtpu 0.0.52 exits on
    --xla_cpu_use_fusion_emitters, which jaxlib 0.10.2 knows). So the first time this process
    compiles for a TPU topology, the CPU backend reads XLA_FLAGS whole first, then libtpu
    reads it without those flags (a one-op compile), and XLA_FLAGS is put back as it was."""
    global _libtpu_flags_read
    flags = os.environ.get("XLA_FLAGS", "")
    if _libtpu_flags_read or CPU_FLAG_PREFIX not in flags:
        return
    import jax

    # XLA:CPU parses XLA_FLAGS when its backend starts; a process without one (JAX_PLATFORMS
    # without cpu) has nothing that reads them
    with contextlib.suppress(RuntimeError):
        jax.devices("cpu")
    os.environ["XLA_FLAGS"] = without_cpu_flags(flags)
    try:
        compile_one_op(device)
    finally:
        os.environ["XLA_FLAGS"] = flags
    _libtpu_flags_read = True


def flag_probe(slice_name: str) -> str:
    """The code trainer/flagsets.py validate runs to probe a flag set for compile-only devices of
    `slice_name`: load them and compile one op (libtpu reads LIBTPU_INIT_ARGS when it loads, and its
    own XLA reads XLA_FLAGS when it first compiles; it may not know a flag jaxlib's XLA knows)."""
    return (f"from {__name__} import compile_one_op, topology_devices; "
            f"compile_one_op(topology_devices({slice_name!r})[0])")


def compile_one_op(device) -> None:
    """Compile a one-op program for `device`: what makes a compiler read its flags. Not written
    to the persistent cache (no_persistent_cache_writes)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    with no_persistent_cache_writes():
        x = jax.ShapeDtypeStruct((8,), "float32", sharding=SingleDeviceSharding(device))
        jax.jit(lambda v: v + 1).lower(x).compile()


# ----------------------------------------------------------------------------- OOM

RESOURCE_EXHAUSTED = 8  # absl::StatusCode::kResourceExhausted
UNKNOWN = 2  # absl::StatusCode::kUnknown
_SIZE_RE = r"\(([\d.]+)\s*([KMGT]?)i?B?\)"
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.upper()])


def is_resource_exhausted(exc: BaseException) -> bool:
    """True when `exc` is XLA's RESOURCE_EXHAUSTED status (decided by the status code;
    older jaxlibs expose the code only as the message's prefix, which is the code too)."""
    from jax.errors import JaxRuntimeError
    if not isinstance(exc, JaxRuntimeError):
        return False
    code = getattr(exc, "error_code", None)
    if code is not None and int(code) != UNKNOWN:
        return int(code) == RESOURCE_EXHAUSTED
    # no code, or UNKNOWN (an error rebuilt from its text): the message starts with the code
    return str(exc).startswith("RESOURCE_EXHAUSTED")


def predicted_oom_from(exc: BaseException, hbm_bytes: int | None = None) -> PredictedOOM | None:
    """The PredictedOOM for a compile error, or None when it is not an out-of-memory."""
    if not is_resource_exhausted(exc):
        return None
    text = getattr(exc, "error_message", None) or str(exc)
    required = available = None
    m = re.search(r"required[^()]*" + _SIZE_RE + r"[^()]*available[^()]*" + _SIZE_RE, text)
    if m:
        required, available = _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
    available = available or hbm_bytes
    first = text.splitlines()[0] if text else "RESOURCE_EXHAUSTED"
    if required is not None and available is not None:
        msg = (f"predicted OOM: the step needs {required / GiB:.2f} GiB per device, the chip has "
               f"{available / GiB:.2f} GiB usable HBM (XLA's TPU compiler: {first})")
    else:
        msg = f"predicted OOM: XLA's TPU compiler ran out of memory: {first}"
    return PredictedOOM(msg, required, available, "compiler")


def bytes_limit(device) -> int | None:
    """The memory a device says it may use (GPU, TPU: its memory_stats' bytes_limit); None
    where it reports none (CPUs, compile-only devices)."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - compile-only devices and CPUs may raise instead of reporting
        return None
    return int(stats["bytes_limit"]) if stats.get("bytes_limit") else None


def local_device_memory() -> tuple[int, bool]:
    """(bytes one local device may use, whether the device reported them): its bytes_limit
    (GPU, TPU), else the host's RAM over the local devices, which share it (CPU). The figure a
    trial is held against when no budget is given, and the one `paxsearch train` checks."""
    import jax
    import psutil

    limit = bytes_limit(jax.local_devices()[0])
    if limit:
        return limit, True
    return int(psutil.virtual_memory().total // jax.local_device_count()), False


def check_fits(peak_bytes: int, hbm_bytes: int, what: str = "usable HBM") -> None:
    """Raise PredictedOOM when a compiled per-device peak exceeds the HBM (or the limit
    `what` names, e.g. a smaller memory budget)."""
    if peak_bytes > hbm_bytes:
        raise PredictedOOM(
            f"predicted OOM: compiled peak {peak_bytes / GiB:.2f} GiB per device > "
            f"{hbm_bytes / GiB:.2f} GiB {what}", peak_bytes, hbm_bytes, "memory_analysis")
