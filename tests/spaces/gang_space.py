"""Slice-gang trials: 8 devices per trial, one process per host (2 hosts x 4 simulated devices,
tests/search/gang/test_slice_gangs.py), four mesh layouts, data in 2 fixed shards so that the
global batches do not depend on how many hosts read them. Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

STUDY, space = tiny_space(study=dict(trials=4, timeout=300),
                          decisions=dict(ici_mesh=["8x1x1", "4x2x1", "2x4x1", "2x2x2"]),
                          per_device_batch=1, steps=4, log_every=2, data=dict(num_shards=2))
