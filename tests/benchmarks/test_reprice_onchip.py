"""benchmarks/reprice_onchip.py's bookkeeping: the chip's measured steps and the variants it prices with (its
pricing of the plans is the roofline's, tested in tests/roofline)."""
from paxsearch.benchmarks import reprice_onchip
from paxsearch.search.planning.predict import hardware_for


def test_every_trained_point_has_its_half_and_its_measured_step():
    measured = reprice_onchip.measured_steps()
    assert len(measured) >= 102 and {h for h, _ in measured.values()} >= set("abcdefg")
    assert all(0.01 < step < 5.0 for _, step in measured.values())
    assert sum(h == "g" for h, _ in measured.values()) == 16


def test_the_op_level_variant_takes_the_fits_figures_and_each_ablation_leaves_one_out():
    fit = {"cycles": {"trigonometric": 20.0, "arithmetic": 0.2}, "dma_share": 0.3,
           "splash_in_step": {"fwd": 1.0, "dq": 1.1, "dkv": 1.2}}
    hw = hardware_for([None], "v5e")
    v = reprice_onchip.variants(hw, fit)
    ops = v["op-level figures"]
    assert v["v5e entry"] is hw
    assert dict(ops.vpu_cycles) == fit["cycles"] and ops.dma_share == 0.3
    assert ops.grid_in_step("splash_mha_dkv_x") == 1.2 and ops.grid_in_step("splash_mha_dq_x") == 1.1
    assert v["  without the VPU cycles"].vpu_cycles == hw.vpu_cycles
    assert v["  without the DMA share"].dma_share == 1.0
    assert v["  without the splash in-step"].attention_in_step == ()
