"""A space for the pruner: three learning rates that train and one (1e-9) that does not move
the loss; single objective loss, the median pruner, each trial reporting its loss every step.
Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

BAD_LR = 1e-9
STUDY, space = tiny_space(study=dict(objectives=["loss"], trials=4, timeout=300, pruner="median"),
                          decisions=dict(lr=[1e-2, 2e-2, 3e-2, BAD_LR]),
                          mesh="8x1x1", warmup_steps=1, per_device_batch=2, steps=8, log_every=1)
