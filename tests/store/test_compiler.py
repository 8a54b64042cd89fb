"""The compiler a plan names (store/compiler.py): the record, how stored plans read (old ones
"unknown"), the study's one line, and the libtpu comparison on a TPU machine. Pure: fake
version dicts and platform strings, no JAX devices."""
import pytest

from paxsearch.store import compiler as C
from paxsearch.store.plan import Plan

NEW = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.52"}
CHIP = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}


def plan(record=..., peak=14 * 2**30) -> Plan:
    """A plan as a study stored it (without a compiler entry when `record` is not given)."""
    p = {"peak_bytes": peak, "plan_method": "compiled"}
    if record is not ...:
        p[C.KEY] = record
    return Plan.from_stored(p)


def test_the_record_is_the_installed_jax_jaxlib_and_libtpu():
    versions = {"jax": "1.0", "jaxlib": "1.1"}
    assert C.made_here(versions.get) == {"jax": "1.0", "jaxlib": "1.1", "libtpu": None}
    here = C.made_here()
    assert set(here) == {"jax", "jaxlib", "libtpu"} and isinstance(here["jax"], str)


@pytest.mark.parametrize("stored, expected", [
    (plan(NEW), NEW),
    (plan(None), C.NOT_COMPILED),  # analytic: nothing compiled
    (plan(), C.UNKNOWN),  # stored before plans named their compiler
    (plan("0.0.52"), C.UNKNOWN), (plan({"jax": 3}), C.UNKNOWN), (plan({"libtpu": "0.0.52"}), C.UNKNOWN),
    (None, C.UNKNOWN),
])
def test_a_stored_plan_reads_as_a_record_analytic_or_unknown(stored, expected):
    assert C.of_plan(stored) == expected


def test_one_plans_compiler_as_text():
    assert C.describe(NEW) == "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"
    assert C.describe({**NEW, "libtpu": None}) == "jax 0.10.2, jaxlib 0.10.2, no libtpu"
    assert C.describe(C.NOT_COMPILED) == "analytic (nothing compiled)"
    assert C.describe(C.UNKNOWN) == "unknown"
    assert C.planned_line(NEW) == "planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"
    assert C.planned_line(C.UNKNOWN).startswith("planned with an unknown compiler")


def test_a_studys_line_says_when_it_mixes_compilers():
    one = [plan(NEW), plan(NEW), None]  # None: a trial without a plan (invalid) is left out
    assert C.planned_with(one) == "planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"
    assert not C.mixed(one)
    two = [plan(NEW), plan(CHIP), plan(CHIP), plan(None)]
    assert C.mixed(two)
    assert C.planned_with(two) == ("planned with mixed compilers: jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.42.1 "
                                   "(2 plans); jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52 (1 plan); "
                                   "1 analytic plan compiled nothing")
    assert C.planned_with([plan(NEW), plan()]).endswith("; 1 plan of an unknown compiler (stored before plans "
                                                        "named theirs)")
    assert C.planned_with([plan(), plan()]) == ("planned with an unknown compiler (stored before plans named "
                                                "theirs)")
    assert C.planned_with([plan(None)]) == "planned analytically: nothing compiled"
    assert C.planned_with([None]) is None and C.planned_with([]) is None


def test_the_libtpu_matters_only_on_a_tpu_machine():
    assert C.libtpu_differs(NEW, "0.0.42.1", "tpu")
    assert not C.libtpu_differs(NEW, "0.0.52", "tpu")
    assert not C.libtpu_differs(NEW, "0.0.42.1", "cpu") and not C.libtpu_differs(NEW, None, "gpu")
    assert C.libtpu_differs({**NEW, "libtpu": None}, "0.0.42.1", "tpu")  # compiled with no TPU compiler at all
    assert not C.libtpu_differs(C.NOT_COMPILED, "0.0.42.1", "tpu")
    assert not C.libtpu_differs(C.UNKNOWN, "0.0.42.1", "tpu")


def test_a_trial_planned_with_another_libtpu_is_rechecked_in_one_line():
    assert C.recheck(plan(NEW), 3, "0.0.52", "tpu") is None
    assert C.recheck(plan(NEW), 3, "0.0.42.1", "cpu") is None
    assert C.recheck(plan(), 3, "0.0.42.1", "tpu") is None and C.recheck(None, 3, "0.0.42.1", "tpu") is None
    found = C.recheck(plan(NEW), 3, "0.0.42.1", "tpu")
    assert found.line == ("trial 3 was planned with libtpu 0.0.52; this machine has 0.0.42.1: its memory is "
                          "re-checked with the local compiler before training")
    limit = int(15.75 * 2**30)
    assert found.refusal(15 * 2**30, limit, "TPU v5 lite bytes_limit") is None
    assert found.refusal(int(16.5 * 2**30), limit, "TPU v5 lite bytes_limit") == (
        "trial 3 does not fit this machine: planned 14.00 GiB per device with libtpu 0.0.52, the local compiler "
        "(libtpu 0.0.42.1) needs 16.50 GiB per device, above the chip's limit of 15.75 GiB (TPU v5 lite "
        "bytes_limit)")
    no_peak = C.recheck(plan(NEW, peak=None), None, None, "tpu")
    assert no_peak.line.startswith("the trial was planned with libtpu 0.0.52; this machine has no libtpu")
    assert "planned with libtpu 0.0.52, the local compiler (no libtpu)" in no_peak.refusal(2, 1, "x")


def test_a_study_continued_on_a_tpu_machine_says_once_which_libtpu_planned_it():
    plans = [plan(NEW), plan(NEW), plan(CHIP), plan(None), plan(), None]
    line = C.study_line(plans, "0.0.42.1", "tpu")
    assert line.startswith("this study's earlier plans were made with another libtpu (2 plans with libtpu 0.0.52); "
                           "this machine has libtpu 0.0.42.1:")
    assert "\n" not in line
    assert C.study_line(plans, "0.0.42.1", "cpu") is None
    assert C.study_line([plan(CHIP), plan(None)], "0.0.42.1", "tpu") is None


def test_the_driver_names_the_workers_compiler_on_a_trained_trials_plan():
    env = {**NEW, "device_kind": "cpu"}
    trained = Plan.from_stored({"peak_bytes": 1, "plan_method": "compiled"})
    assert C.named(trained, env).to_stored() == {**trained.to_stored(), C.KEY: NEW}
    # plans that name theirs, answers of the screen, and no worker environment: as they are
    for p in (plan(CHIP), plan(None),
              Plan.from_stored({"peak_bytes": 1, "plan_method": "study", "screen": "duplicate of trial 0"}),
              Plan.from_stored({"peak_bytes": 1, "plan_method": "compiled", "screen": "plan cache"}), None):
        assert C.named(p, env) == p
    assert C.named(trained, None) == trained and C.named(trained, {"jax": None}) == trained
