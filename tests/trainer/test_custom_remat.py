"""Custom remat policies ("custom:<tensor>=<choice>,..."): parsing, one-line errors, offload
refused on CPU, and the compiled memory of the saved set."""
import dataclasses

import pytest

from paxsearch.trainer import remat, validate
from paxsearch.trainer.errors import ConfigError, UnsupportedOnPlatform
from paxsearch.trainer.plan import plan

from .knobs_util import MODEL, config

MINIMAL = remat.custom(query_proj="device", key_proj="device", value_proj="device", context="device",
                       out_proj="device", mlp2="device")


def test_custom_builds_a_canonical_string_that_parses_back():
    text = remat.custom(mlp2="offload", decoder_input="offload", query_proj="recompute", key_proj="device")
    assert text == "custom:decoder_input=offload,key_proj=device,mlp2=offload"
    parsed = remat.parse_custom(text)
    assert parsed["decoder_input"] == "offload" and parsed["query_proj"] == "recompute" and set(parsed) == set(
        remat.TENSORS)
    assert remat.offloads(text) and not remat.offloads(MINIMAL)


@pytest.mark.parametrize("text", ["custom:query=device", "custom:query_proj=keep", "custom:mlp1",
                                  "custom:mlp1=device,mlp1=offload", "bogus"])
def test_a_bad_custom_policy_is_one_config_error(text):
    with pytest.raises(ConfigError) as e:
        validate.check(config(remat=text), 8, "cpu")
    assert "\n" not in str(e.value) and ("tensor=choice" in str(e.value) or "unknown remat policy" in str(e.value))


def test_custom_offload_is_refused_on_cpu_and_accepted_on_tpu():
    text = remat.custom(decoder_input="offload")
    with pytest.raises(UnsupportedOnPlatform, match="offloads to host memory, which platform 'cpu' lacks"):
        validate.check(config(remat=text), 8, "cpu")
    remat.check_policy(text, "tpu")


def test_custom_saves_what_it_names():
    cfg = config(global_batch=32, model=dataclasses.replace(MODEL, n_layers=4))
    temp = {name: plan(dataclasses.replace(cfg, remat=name), count_flops=False).memory.temp_bytes
            for name in ("minimal", MINIMAL, "custom:")}
    assert temp[MINIMAL] == temp["minimal"]  # the same names saved: the same program
    assert temp["custom:"] < temp[MINIMAL], temp  # recompute everything: less held for the backward
