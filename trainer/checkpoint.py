"""Orbax checkpoints of the train state: save every N steps and at the end, keep K, resume."""
from __future__ import annotations

import os

import orbax.checkpoint as ocp

from .config import CheckpointConfig


def checkpoint_dir(ckpt: CheckpointConfig, run_dir: str | None) -> str | None:
    if ckpt.directory:
        return os.path.abspath(ckpt.directory)
    return os.path.abspath(os.path.join(run_dir, "checkpoints")) if run_dir else None


class Checkpointer:
    def __init__(self, ckpt: CheckpointConfig, run_dir: str | None):
        directory = checkpoint_dir(ckpt, run_dir)
        if directory is None:
            raise ValueError("checkpointing needs a run_dir or checkpoint.directory")
        self.every = ckpt.every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=ckpt.keep, create=True, enable_async_checkpointing=ckpt.async_save)
        self.manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, abstract_state, step: int | None = None):
        """The state at `step` (default: latest), placed with abstract_state's shardings."""
        step = self.manager.latest_step() if step is None else step
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def maybe_save(self, step: int, state, force: bool = False) -> bool:
        if not force and not (self.every and step % self.every == 0):
            return False
        if step in self.manager.all_steps():
            return False
        return self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

