"""A slice gang whose trials need two compiler flag sets (the whole gang starts again with each)
and the median pruner over the loss (a pruned trial ends on every host at the same step):
tests/search/gang/test_slice_gangs.py. Learning rates 1e-2 and 2e-2 learn; 1e-9 does not move
the loss. Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

BAD_LR = 1e-9
STUDY, space = tiny_space(study=dict(objectives=["loss"], trials=3, timeout=300, pruner="median"),
                          decisions=dict(flags=["default", "cpu_eigen_dots"], lr=[1e-2, 2e-2, BAD_LR]),
                          mesh="8x1x1", warmup_steps=1, per_device_batch=2, steps=8, log_every=1)
