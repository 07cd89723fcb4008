"""The autoregressive pipeline baseline: B stages chained give the whole model's next-byte logits."""

import pytest
import torch

from swarm.model.autoregressive import ByteTransformer
from swarm.serving.ar_pipeline import check_stage_input, run_stage, stage_layers
from swarm.serving.wire import RequestError


@pytest.mark.parametrize("n_layers, n_stages", [(11, 4), (4, 2), (3, 3), (5, 1)])
def test_stages_cover_every_layer_once(n_layers, n_stages):
    layers = [i for s in range(n_stages) for i in stage_layers(n_layers, n_stages, s)]
    assert layers == list(range(n_layers))


def test_chained_stages_equal_the_whole_model(tiny_config):
    torch.manual_seed(0)
    model = ByteTransformer(tiny_config).eval()
    tokens = torch.randint(0, 256, (3, 20))
    x = tokens
    with torch.no_grad():
        for stage in range(tiny_config.n_blocks):
            check_stage_input(tiny_config, stage, x)
            x = run_stage(model, stage, tiny_config.n_blocks, x)
        assert torch.allclose(x, model(tokens)[:, -1], atol=1e-5)


def test_stage_inputs_are_checked(tiny_config):
    with pytest.raises(RequestError):
        check_stage_input(tiny_config, 0, torch.full((1, 4), 300))
    with pytest.raises(RequestError):
        check_stage_input(tiny_config, 1, torch.randint(0, 256, (1, 4)))
    with pytest.raises(RequestError):
        check_stage_input(tiny_config, 1, torch.full((1, 4, tiny_config.d_model), float("nan")))
