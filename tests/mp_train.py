"""One process of a multi-process training run (used by the multi-host test).

python -m paxsearch.tests.mp_train PROCESS_ID NUM_PROCESSES PORT OUT_JSON
"""
import json
import os
import sys


def main() -> None:
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ["JAX_PLATFORMS"] = "cpu"
    from paxsearch.trainer.flagsets import with_device_count

    os.environ["XLA_FLAGS"] = with_device_count("", 8 // nproc)
    from paxsearch.tests.trainer_util import tiny
    from paxsearch.trainer.config import DistributedConfig
    from paxsearch.trainer.train import train

    cfg = tiny(ici=(1, 4, 1), dcn=(2, 1, 1), distributed=DistributedConfig(
        coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid))
    seen = {}
    result = train(cfg, report=lambda m: seen.__setitem__(m.step, m.loss))
    if pid == 0:
        with open(out, "w") as f:
            json.dump({"losses": seen, "mesh": result.plan.mesh_shape}, f)


if __name__ == "__main__":
    main()
