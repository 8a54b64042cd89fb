"""The trial outcome record (store/outcome.py) and the one classifier (search/trial/classify.py):
stored strings that never change, the wire and storage forms read back, and every way a trial
ends mapped to one kind."""
import json
import signal

import pytest

from paxsearch.search.planning.topology import PredictedOOM
from paxsearch.search.study.settings import SettingsError
from paxsearch.search.trial import ExitStatus, Phase, classify
from paxsearch.search.trial.classify import last_fatal_line
from paxsearch.search.trial.record import driver_timings
from paxsearch.store import FAILURE_KINDS, Counters, Kind, Measured, Plan, TrialOutcome, kind_of
from paxsearch.trainer.errors import ConfigError, DataError, NonFiniteLoss

FULL = TrialOutcome(
    kind=Kind.OK, plan=Plan.make(peak_bytes=123, predicted_mfu=0.4, mesh_shape={"data": 1, "fsdp": 8, "tensor": 1}),
    measured=Measured(loss=2.5, eval_loss=2.75, mfu=0.31, hfu=0.4, tokens_per_sec=1e5, step_time=0.25,
                      peak_bytes=456, steps=16),
    timings={"plan_s": 1.5, "train_s": 3.25, "worker_s": 5.0}, counters=Counters(train_calls=1, steps_run=16),
    intermediate=[[8, 3.0], [16, 2.5]], memory_budget={"bytes": 1000, "source": "setting"},
    peak_flops={"value": 1e12, "source": "measured"})
ENV = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None, "device_kind": "cpu", "platform": "cpu",
       "num_devices": 8, "xla_flags": "", "process_count": 1, "flag_set": "default", "libtpu_init_args": "",
       "pid": 1234}


def test_kinds_keep_the_strings_stored_studies_hold():
    assert [k.value for k in FAILURE_KINDS] == ["invalid", "predicted_oom", "compile_error", "runtime_oom",
                                                "nan_loss", "timeout", "interrupted", "crash", "host_lost"]
    assert Kind.stored(None) is Kind.OK and Kind.stored("") is Kind.OK and Kind.stored("nan_loss") is Kind.NAN_LOSS
    assert Kind.OK.stored_text is None and Kind.CRASH.stored_text == "crash"
    assert kind_of({"failure_kind": "host_lost"}) is Kind.HOST_LOST and kind_of({}) is Kind.OK


def test_which_kinds_every_host_of_a_gang_reaches_alike():
    alike = {k for k in Kind if k.same_on_every_host}
    assert alike == {Kind.OK, Kind.INVALID, Kind.PREDICTED_OOM, Kind.COMPILE_ERROR, Kind.NAN_LOSS}
    assert {k for k in Kind if k.runs_again} == {Kind.HOST_LOST, Kind.INTERRUPTED}


@pytest.mark.parametrize("outcome", [
    FULL,
    FULL.failed_as(Kind.NAN_LOSS, "loss is nan at step 3"),
    TrialOutcome.failure(Kind.TIMEOUT, "trial ran past its 5 s limit"),
    TrialOutcome(predicted=True, plan=Plan.make(peak_bytes=1, screen="analytic"), device={"device_kind": "TPU v5 lite"},
                 pruned=True, steered={"dominated_by": 3}),
])
def test_wire_form_reads_back_through_json(outcome):
    wire = json.loads(json.dumps(outcome.to_wire()))
    assert wire["type"] == "result"
    assert ("failure_kind" in wire) == outcome.kind.failed
    assert TrialOutcome.from_wire(wire) == outcome


def test_storage_form_reads_back_and_folds_in_the_environment():
    stored = FULL.replace(timings=driver_timings(FULL, 6.0)).with_env(ENV)
    attrs = json.loads(json.dumps(stored.to_user_attrs()))
    assert attrs["timings"] == {"plan_s": 1.5, "train_s": 3.25, "total_s": 6.0, "overhead_s": 1.25}
    assert attrs["memory_bytes"] == 123 and attrs["constraint"] == [123.0 - 1000]
    assert attrs["env"]["peak_flops_per_device"] == 1e12 and "pid" not in attrs["env"]
    assert "failure_kind" not in attrs and None not in attrs.values()
    assert TrialOutcome.from_user_attrs(attrs) == stored
    failed = stored.failed_as(Kind.RUNTIME_OOM, "worker killed by the kernel's OOM killer")
    back = TrialOutcome.from_user_attrs(failed.to_user_attrs())
    assert back.kind is Kind.RUNTIME_OOM and back.message == failed.message and back == failed


def test_a_trial_without_training_stores_empty_scores_and_its_steps():
    attrs = TrialOutcome.failure(Kind.NAN_LOSS, "diverged", counters=Counters(1, 7)).to_user_attrs()
    assert attrs["measured"] == {"loss": None, "eval_loss": None, "mfu": None, "hfu": None, "tokens_per_sec": None,
                                 "step_time": None, "peak_bytes": None, "steps": 7}
    assert attrs["failure_kind"] == "nan_loss" and "plan" not in attrs and "memory_bytes" not in attrs


def test_attrs_a_previous_release_stored_still_read():
    """user_attrs exactly as paxsearch at f5148fc (records.trial_attrs) wrote them."""
    old = {"plan": {"peak_bytes": 99, "predicted_mfu": None}, "memory_bytes": 99,
           "measured": {"loss": 1.5, "eval_loss": None, "mfu": 0.2, "hfu": 0.3, "tokens_per_sec": 10.0,
                        "step_time": 0.1, "peak_bytes": 5, "steps": 8},
           "timings": {"plan_s": 1.0, "train_s": 2.0, "total_s": 3.5, "overhead_s": 0.5},
           "counters": {"train_calls": 1, "steps_run": 8}, "predicted": False, "env": dict(ENV),
           "decisions": {"mesh": "1x8x1"}, "config": "{}", "trial_dir": "/x/trials/0", "owner": {"pid": 1}}
    o = TrialOutcome.from_user_attrs(old)
    assert o.kind is Kind.OK and o.measured.score_loss == 1.5 and o.counters.steps_run == 8 and o.memory_bytes == 99
    failed = TrialOutcome.from_user_attrs({"failure_kind": "predicted_oom", "failure_message": "too big",
                                           "plan": {"peak_bytes": 7}})
    assert failed.kind is Kind.PREDICTED_OOM and failed.message == "too big" and failed.measured is None


@pytest.mark.parametrize("error, phase, kind", [
    (ConfigError("mesh 3x1x1 does not divide 8 devices"), Phase.CHECK, Kind.INVALID),
    (ConfigError("x"), Phase.PLAN, Kind.INVALID),
    (ConfigError("x"), Phase.TRAIN, Kind.INVALID),
    (DataError("no task"), Phase.TRAIN, Kind.INVALID),
    (SettingsError("tokens"), Phase.SETUP, Kind.INVALID),
    (ValueError("bad value"), Phase.SETUP, Kind.INVALID),
    (ValueError("bad value"), Phase.TRAIN, Kind.CRASH),
    (PredictedOOM("needs 9 GiB, has 8 GiB", 9, 8), Phase.SCREEN, Kind.PREDICTED_OOM),
    (MemoryError(), Phase.PLAN, Kind.PREDICTED_OOM),
    (RuntimeError("XLA could not lower"), Phase.PLAN, Kind.COMPILE_ERROR),
    (MemoryError(), Phase.TRAIN, Kind.RUNTIME_OOM),
    (NonFiniteLoss("loss nan", step=3), Phase.TRAIN, Kind.NAN_LOSS),
    (RuntimeError("boom"), Phase.TRAIN, Kind.CRASH),
    (KeyError("k"), Phase.SCREEN, Kind.CRASH),
])
def test_exceptions_are_classified_by_type_and_phase(error, phase, kind):
    got, message = classify(error, phase)
    assert got is kind
    assert message and "\n" not in message


@pytest.mark.parametrize("status, kind, words", [
    (ExitStatus(-signal.SIGKILL, killed_by="timeout"), Kind.TIMEOUT, "time limit"),
    (ExitStatus(-signal.SIGKILL, killed_by="interrupt"), Kind.INTERRUPTED, "interrupt"),
    (ExitStatus(-signal.SIGKILL, oom_evidence="oom_kill in memory.events rose from 0 to 1"), Kind.RUNTIME_OOM,
     "OOM killer"),
    (ExitStatus(-signal.SIGKILL), Kind.CRASH, "SIGKILL from outside"),
    (ExitStatus(-signal.SIGSEGV), Kind.CRASH, "SIGSEGV"),
    (ExitStatus(None), Kind.CRASH, "stopped answering"),
    (ExitStatus(1), Kind.CRASH, "status 1"),
])
def test_worker_exits_are_classified(status, kind, words):
    got, message = classify(status)
    assert got is kind and words in message


# what XLA wrote before it aborted a worker (benchmarks/RESULTS.md, "CI's timeout of stop 31"), among other lines
XLA_ABORT_LOG = """== trial 1 on worker pid 13736 (2026-12-05 18:26:41)
E1205 18:26:42.582 13749 rendezvous.cc:116] [id=1] This thread has been waiting for `all reduce` for 1 seconds
F1205 18:26:43.591628   13747 rendezvous.cc:161] [id=0] Termination timeout for `all reduce RendezvousKey{...}` \
of 1 seconds exceeded.
F1205 18:26:43.591834   13752 rendezvous.cc:161] [id=2]   Termination timeout   for `all reduce RendezvousKey{...}`
*** Check failure stack trace: ***
    @     0x7f2549440634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
"""


def test_a_signal_death_names_the_last_native_fatal_line_and_is_still_a_crash():
    line = last_fatal_line(XLA_ABORT_LOG)
    assert line == "rendezvous.cc:161] [id=2] Termination timeout for `all reduce RendezvousKey{...}`"
    assert last_fatal_line("E1205 18:26:42.582 13749 rendezvous.cc:116] waiting\nFatal Python error: Aborted") is None
    kind, message = classify(ExitStatus(-signal.SIGABRT, fatal_line=line))
    assert kind is Kind.CRASH and message == f"worker died of SIGABRT; its last fatal log line: {line}"
    assert last_fatal_line("F1205 18:26:43.5 1 a.cc:1] " + "x" * 1000) == "a.cc:1] " + "x" * 292


def test_an_exit_on_a_fatal_line_without_a_signal_names_it_too():
    """glog's quick fatal (XLA refusing an XLA_FLAGS flag when it starts) exits 1, no signal."""
    line = last_fatal_line("F1206 12:02:23.688438   28603 parse_flags_from_env.cc:234] Unknown flag in "
                           "XLA_FLAGS: --xla_cpu_use_fusion_emitters=false")
    kind, message = classify(ExitStatus(1, fatal_line=line))
    assert kind is Kind.CRASH and message == ("worker exited with status 1 without a result; its last fatal log line: "
                                              "parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: "
                                              "--xla_cpu_use_fusion_emitters=false")
    assert classify(ExitStatus(1))[1] == "worker exited with status 1 without a result"
