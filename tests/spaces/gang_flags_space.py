"""A slice gang whose trials need two compiler flag sets: the whole gang starts again with each
(tests/search/gang/test_slice_gangs.py). Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

STUDY, space = tiny_space(study=dict(trials=2, timeout=300),
                          decisions=dict(flags=["default", "cpu_eigen_dots"]),
                          mesh="4x2x1", per_device_batch=1, steps=2, log_every=1, data=dict(num_shards=2))
