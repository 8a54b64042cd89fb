"""measured_peak_bytes on each platform's memory_stats: a TPU's program temporaries are counted."""
import resource

from paxsearch.trainer.distributed import device_peak_bytes


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
