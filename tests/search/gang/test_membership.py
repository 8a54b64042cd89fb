"""Slice-gang membership: the command line's, or the launcher's (SLURM, GKE/JobSet, Cloud TPU
VM metadata served on loopback), with one-line errors."""
import http.server
import threading

import pytest

from paxsearch.search.cli import main as cli_main
from paxsearch.search.gang import membership as M


def test_explicit_membership_and_its_errors():
    m = M.resolve("10.0.0.2:8482", 4, 3, env={})
    assert (m.coordinator, m.num_hosts, m.host_index, m.leader, m.source) == ("10.0.0.2:8482", 4, 3, False,
                                                                              "command line")
    assert M.resolve("h:1", 1, 0, env={}) is None  # one host works alone
    assert M.resolve(env={}) is None  # nothing given, nothing detected
    with pytest.raises(M.MembershipError, match="missing --num-hosts, --host-index"):
        M.resolve("h:1", None, None, env={})
    with pytest.raises(M.MembershipError, match=r"host index 4 is not in \[0, 3\]"):
        M.resolve("h:1", 4, 4, env={})
    with pytest.raises(M.MembershipError, match="is not HOST:PORT"):
        M.resolve("no-port", 2, 0, env={})
    with pytest.raises(M.MembershipError, match="is not HOST:PORT"):
        M.resolve("h:70000", 2, 0, env={})


def test_slurm_membership_follows_jax_conventions():
    env = {"SLURM_JOB_ID": "12345", "SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
           "SLURM_STEP_NODELIST": "tpu-node[007-010],other"}
    m = M.resolve(env=env)
    # jax/_src/clusters/slurm_cluster.py: first node, port 61440 + job id mod 4096
    assert m.coordinator == f"tpu-node007:{12345 % 4096 + 61440}"
    assert (m.num_hosts, m.host_index, m.source) == (4, 2, "SLURM")
    assert M.resolve(env=env, detect=False) is None  # --no-gang
    assert M.resolve(env={**env, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    with pytest.raises(M.MembershipError, match="SLURM_NTASKS='four' is not a number"):
        M.resolve(env={**env, "SLURM_NTASKS": "four"})


def test_gke_jobset_membership_single_and_multi_slice():
    env = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "js-0-0.svc,js-0-1.svc,js-0-2.svc,js-0-3.svc"}
    m = M.resolve(env=env, tpu_machine=True)
    assert (m.coordinator, m.num_hosts, m.host_index, m.source) == ("js-0-0.svc:8482", 4, 1, "GKE")
    multi = {**env, "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
             "MEGASCALE_COORDINATOR_ADDRESS": "js-0-0.svc:8080"}
    m = M.resolve(env=multi, tpu_machine=True)
    assert (m.coordinator, m.num_hosts, m.host_index) == ("js-0-0.svc:8482", 8, 5)
    assert M.resolve(env=env, tpu_machine=False) is None  # the variables alone, on a machine without TPUs


def test_compile_only_tpu_variables_on_a_cpu_machine_form_no_gang():
    """Planning sets TPU_WORKER_HOSTNAMES=localhost (and libtpu may write a warning into
    TPU_WORKER_ID); a worker started from that environment must work alone, not fail."""
    from paxsearch.search.planning import topology

    env = {**topology.compile_only_env(topology.parse_slice("v5e-16")),
           "TPU_WORKER_ID": "WARNING: could not determine TPU worker number"}
    assert M.resolve(env=env) is None
    assert M.resolve(env=env, tpu_machine=True) is None  # one worker listed: alone


class _Metadata(http.server.BaseHTTPRequestHandler):
    values = {"agent-worker-number": "2", "worker-network-endpoints": "w-0:x:10.1.0.4,w-1:x:10.1.0.5,w-2:x:10.1.0.6"}

    def do_GET(self):
        key = self.path.rsplit("/", 1)[-1]
        ok = self.headers.get("Metadata-Flavor") == "Google" and key in self.values
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(self.values.get(key, "").encode())

    def log_message(self, *args):
        pass


def test_cloud_tpu_vm_membership_from_the_metadata_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"}
        m = M.resolve(env=env, tpu_machine=False)  # GCE_METADATA_IP says where to ask
        assert (m.coordinator, m.num_hosts, m.host_index, m.source) == ("10.1.0.4:8482", 3, 2,
                                                                        "Cloud TPU metadata")
        assert M.resolve(env={**env, "TPU_SKIP_MDS_QUERY": "1"}) is None
        _Metadata.values = {"agent-worker-number": "1", "worker-network-endpoints": "10.1.0.4,10.1.0.5"}
        m = M.resolve(env=env)  # the newer format: plain host names
        assert (m.coordinator, m.num_hosts, m.host_index) == ("10.1.0.4:8482", 2, 1)
        _Metadata.values = {"agent-worker-number": "5", "worker-network-endpoints": "10.1.0.4,10.1.0.5"}
        with pytest.raises(M.MembershipError, match=r"host index 5 is not in \[0, 1\]"):
            M.resolve(env=env)
    finally:
        server.shutdown()


def test_worker_with_half_a_membership_is_one_line(capsys, tmp_path):
    code = cli_main(["worker", "--storage", f"sqlite:///{tmp_path}/none.db", "--coordinator", "h:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "missing --num-hosts, --host-index" in err[0]
