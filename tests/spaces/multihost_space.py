"""Two-process trials: 2 processes x 4 simulated devices, a DCN axis across the processes.
Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

STUDY, space = tiny_space(study=dict(trials=2, processes=2, timeout=240),
                          decisions=dict(ici_mesh=["1x4x1", "2x2x1"]),
                          dcn_data=2, per_device_batch=1, steps=4, log_every=2)
