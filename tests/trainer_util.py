"""Small configs shared by the trainer tests."""
import dataclasses

from paxsearch.trainer.config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    TrainConfig,
)


def tiny(ici=(8, 1, 1), dcn=(1, 1, 1), steps=3, log_every=1, **kw) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(vocab_size=384, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, seq_len=64),
        mesh=MeshConfig(ici=ici, dcn=dcn), per_device_batch=None, global_batch=16, steps=steps,
        warmup_steps_for_timing=1, eval=EvalConfig(enabled=False), log=LogConfig(every_steps=log_every),
        checkpoint=CheckpointConfig(enabled=False), data=DataConfig(num_shards=2))
    return dataclasses.replace(base, **kw)
