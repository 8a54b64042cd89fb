"""HBM bytes as the TPU lays arrays out (search/planning/roofline/hlo.py tiled_dims): a layout's first
tile pads the minor-most dimensions, in layout order, up to its multiples. The m100 points of the on-chip
benchmark (head dim 64, 12 heads) move 14% more bytes in their elementwise ops than their shapes say,
and their plans were up to 13.6% fast on the v5e chip before this was counted (benchmarks/RESULTS.md,
'The v5e entry from the chip's own figures')."""
from paxsearch.search.planning.roofline import hlo


def test_a_head_dim_of_64_takes_the_lanes_of_128():
    # layout {4,2,3,1,0}: dim 4 (64) is minor-most -> 128 lanes; dim 2 (8192) second -> a multiple of 8
    assert hlo.tiled_dims([12, 2, 8192, 12, 64], "{4,2,3,1,0:T(8,128)(2,1)}") == [12, 2, 8192, 12, 128]
    assert hlo.hbm_shape_bytes("bf16[12,2,8192,12,64]{4,2,3,1,0:T(8,128)(2,1)}") == 2 * 12 * 2 * 8192 * 12 * 128


def test_the_second_minor_dimension_rounds_to_the_tiles_sublanes():
    # layout {2,1,0}: dim 1 (12 heads) is second-minor -> 16; dim 2 (128) already whole
    assert hlo.tiled_dims([4, 12, 128], "{2,1,0:T(8,128)}") == [4, 16, 128]
    # layout {1,2,0}: now dim 2 is second-minor, dim 1 minor-most
    assert hlo.tiled_dims([4, 12, 128], "{1,2,0:T(8,128)}") == [4, 128, 128]


def test_whole_tiles_one_dimensional_tiles_and_untiled_layouts():
    assert hlo.hbm_shape_bytes("f32[4,2048,1024]{2,1,0:T(8,128)}") == 4 * 4 * 2048 * 1024
    assert hlo.tiled_dims([5000], "{0:T(1024)}") == [5120]
    assert hlo.hbm_shape_bytes("f32[5]{0}") == 20  # a CPU / GPU layout: no tile
    assert hlo.hbm_shape_bytes("f32[5]") == 20
    assert hlo.hbm_shape_bytes("s32[]{:T(128)}") == 4
    # host memory and VMEM stay out of HBM's count, tiled or not
    assert hlo.hbm_shape_bytes("bf16[16,64]{1,0:T(8,128)(2,1)S(5)}") == 0
    # a tuple: each array by its own layout
    assert hlo.hbm_shape_bytes("(bf16[8,64]{1,0:T(8,128)(2,1)}, f32[8,128]{1,0:T(8,128)})") == 2 * 8 * 128 + 4 * 8 * 128
