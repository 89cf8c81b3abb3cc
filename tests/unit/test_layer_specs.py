"""Which layer spec a run builds (model.layer_spec, megatron_pc/models/layer_specs.py), and the
refusals that name Transformer Engine and the two ways to get it."""

from __future__ import annotations

import pytest

from megatron_pc.errors import ConfigError
from megatron_pc.models.config import ModelConfig
from megatron_pc.models.layer_specs import LayerSpecError, resolve_layer_spec


@pytest.mark.parametrize("sp,on_gpu,te,expected", [
    (False, False, False, "local"),  # the CPU runs keep Megatron's local spec
    (True, False, False, "sdpa"),  # SP on CPU (the GPU settings executed here)
    (False, True, False, "sdpa"),  # a GPU without TE: no unfused score matrix
    (True, True, False, "sdpa"),
    (True, True, True, "te"),
    (False, True, True, "te"),
])
def test_auto_resolves_to_te_where_usable_else_ours_on_a_gpu_or_with_sp(sp: bool, on_gpu: bool, te: bool, expected: str) -> None:
    assert resolve_layer_spec("auto", sp, on_gpu, te) == expected


def test_an_explicit_spec_that_can_be_built_is_kept() -> None:
    assert resolve_layer_spec("sdpa", False, False, False) == "sdpa"
    assert resolve_layer_spec("local", False, True, True) == "local"
    assert resolve_layer_spec("te", True, True, True) == "te"


def test_te_without_transformer_engine_is_refused_naming_both_ways_to_get_it() -> None:
    with pytest.raises(LayerSpecError, match=r"model.layer_spec=te needs Transformer Engine.*does not import.*"
                                             r"docker/Dockerfile.*install.sh --gpu.*nvcc.*model.layer_spec=sdpa"):
        resolve_layer_spec("te", True, True, False)
    with pytest.raises(LayerSpecError, match="there is no GPU"):
        resolve_layer_spec("te", False, False, False)


def test_megatron_local_spec_with_sequence_parallelism_is_refused() -> None:
    with pytest.raises(LayerSpecError, match=r"WrappedTorchNorm.*model.layer_spec=sdpa or te.*Transformer Engine.*"
                                             r"training.sequence_parallel=false"):
        resolve_layer_spec("local", True, True, False)


def test_model_config_checks_the_name() -> None:
    assert ModelConfig().layer_spec == "auto"
    with pytest.raises(ConfigError, match=r"layer_spec: must be auto, te, sdpa or local, got 'flash'"):
        ModelConfig(layer_spec="flash")


def test_the_config_refuses_megatron_local_spec_with_explicit_sequence_parallelism_at_load() -> None:
    from megatron_pc.config import load_config

    with pytest.raises(ConfigError, match=r"model.layer_spec: local .*cannot run training.sequence_parallel"):
        load_config(None, ["model.layer_spec=local", "training.sequence_parallel=true", "model.tensor_parallel=2",
                           "cluster.data_parallel=1"])
    assert load_config(None, ["model.layer_spec=sdpa", "training.sequence_parallel=true"]).model.layer_spec == "sdpa"
