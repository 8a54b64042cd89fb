"""benchmarks/reprice_onchip.py's bookkeeping: the chip's measured steps and the variants it prices with (its
pricing of the plans is the roofline's, tested in tests/roofline)."""
from paxsearch.benchmarks import reprice_onchip
from paxsearch.search.planning.predict import hardware_for


def test_every_trained_point_has_its_half_and_its_measured_step():
    measured = reprice_onchip.measured_steps()
    assert len(measured) >= 118 and {h for h, _ in measured.values()} >= set("abcdefgh")
    assert all(0.01 < step < 5.0 for _, step in measured.values())
    assert sum(h == "g" for h, _ in measured.values()) == 16


def test_the_variants_leave_out_one_figure_each_and_the_fit_replaces_the_entrys():
    hw = hardware_for([None], "v5e")
    v = reprice_onchip.variants(hw)
    assert v["v5e entry"] is hw and hw.vpu_cycles and hw.dma_overlap and hw.attention_in_step
    assert hw.attention_step_grid and dict(hw.vpu_cycles)["transpose"] > 10 * dict(hw.vpu_cycles)["movement"]
    run6 = v["before run 7"]
    assert run6.attention_step_grid == () and run6.attention_in_step == hw.attention_in_step
    assert dict(run6.vpu_cycles)["transpose"] == dict(run6.vpu_cycles)["movement"]
    before = v["before run 6"]
    assert before.vpu_cycles == () and not before.dma_overlap and before.attention_in_step == ()
    assert before.attention_step_grid == ()
    assert v["  without the VPU cycles"].vpu_cycles == () and v["  without the VPU cycles"].dma_overlap
    assert not v["  without the DMA overlap"].dma_overlap
    assert v["  without the splash kernels' rates in the steps"].attention_step_grid == ()
    alone = v["  splash at the grid measured alone"]
    assert alone.attention_step_grid == () and alone.attention_in_step == ()
    fit = {"cycles": {"trigonometric": 20.0, "arithmetic": 0.2}, "dma_share": 0.3}
    v = reprice_onchip.variants(hw, fit)
    ops = v["v5e entry"]
    assert dict(ops.vpu_cycles) == fit["cycles"] and ops.dma_overlap
    share = v["  the DMAs at the measured share instead"]
    assert share.dma_share == 0.3 and not share.dma_overlap
