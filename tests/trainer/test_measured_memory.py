"""measured_peak_bytes on each platform's memory_stats: a TPU's program temporaries are counted."""
import resource

from paxsearch.trainer.distributed import PeakMeter, device_peak_bytes, marks_at_rest


def test_tpu_counts_buffers_and_program_temporaries():
    # memory_stats as a v5e chip (libtpu 0.0.42.1) reported them after one step (benchmarks/RESULTS.md)
    stats = {"bytes_in_use": 1075517952, "peak_bytes_in_use": 1075517952, "bytes_reserved": 557056,
             "peak_bytes_reserved": 557056, "bytes_limit": 16909336064}
    assert device_peak_bytes(stats) == 1075517952 + 557056


def test_gpu_without_reserved_bytes_is_its_buffers_peak():
    assert device_peak_bytes({"bytes_in_use": 10, "peak_bytes_in_use": 4096}) == 4096


def test_no_stats_is_the_process_peak_rss():
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert device_peak_bytes(None) >= rss > 0
    assert device_peak_bytes({"bytes_in_use": 1}) >= rss


class _Device:
    """A device whose memory_stats are the given dicts, in turn (the pure logic of PeakMeter)."""

    def __init__(self, *stats):
        self.stats = list(stats)

    def memory_stats(self):
        return self.stats.pop(0)


def _stats(in_use, peak, reserved=0, peak_reserved=0):
    return {"bytes_in_use": in_use, "peak_bytes_in_use": peak, "bytes_reserved": reserved,
            "peak_bytes_reserved": peak_reserved}


def test_the_first_run_of_a_process_reads_the_devices_peak():
    # as the v5e chip's runtime reported a fresh process: the marks equal what is in use
    meter = PeakMeter(_Device(_stats(26624, 26624), _stats(7_000, 9_000, 2_000, 3_000)))
    assert meter.attributable and meter.read() == 9_000 + 3_000


def test_a_later_run_in_the_same_process_is_not_measured():
    # a worker's second trial: an earlier trial left its peaks above what is now in use (on the
    # chip, 15.98 GiB stood for every later trial of a worker; benchmarks/RESULTS.md)
    meter = PeakMeter(_Device(_stats(1_000, 17_000, 0, 5_000), _stats(9_000, 17_000, 2_000, 5_000)))
    assert not meter.attributable and meter.read() == 0
    assert not marks_at_rest(_stats(0, 0, 0, 10))


def test_cpu_has_no_marks_and_reads_the_process_rss():
    meter = PeakMeter(_Device(None, None))
    assert meter.attributable and meter.read() > 0
