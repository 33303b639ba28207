"""Routed experts read from outside the engine are checked by value, not only by shape: ids in
[0, num_experts) or -1 for a whole token, integer dtype, a token's top-k experts distinct;
from the rollout engine (a generation's tables) and from a checkpoint's
rollout_routing.safetensors (as written, then garbled). The engine's own check at replay runs
in tests/dist/test_engine_moe.py (``corrupt_refused``).

Before this change only shapes were checked: an expert id of 999 in a checkpoint reached the
routers (an index past the expert weights)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_mp.data.sampler import ResumableBatchSampler
from verl_mp.models.routing import check_routed_experts

from tests.unit.test_trainer_offpolicy import _OrderedRollout, _run, _source

pytestmark = pytest.mark.unit

MODEL = {"num_layers": 2, "num_experts": 1000, "top_k": 2}  # the fake rollout's ids go up to ~400


def _check(table, **kw):
    check_routed_experts(table, **{"num_experts": 8, "top_k": 2, "num_layers": 3, "where": "T", **kw})


def test_sound_tables_pass():
    table = torch.tensor([[[0, 1], [7, 2], [-1, -1]], [[-1, -1], [-1, -1], [-1, -1]]], dtype=torch.int16)
    _check(table)
    _check(table.to(torch.int64))


@pytest.mark.parametrize("value,message", [
    ([8, 0], r"T: expert ids must be \[0, 8\), or -1 .*token 1, layer 2, holds \[8, 0\]"),
    ([-2, 3], r"holds \[-2, 3\]"),
    ([-1, 3], r"or -1 for all of a token's experts"),  # half natural: not a routing
    ([5, 5], r"T: a token's top-2 experts must be distinct; token 1, layer 2, holds \[5, 5\]"),
])
def test_bad_values_are_refused_with_where_and_what(value, message):
    table = torch.zeros((2, 3, 2), dtype=torch.int16)
    table[..., 1] = 1
    table[1, 2] = torch.tensor(value)
    with pytest.raises(ValueError, match=message):
        _check(table)


def test_bad_dtype_and_shapes_are_refused():
    with pytest.raises(ValueError, match="integer expert ids, not torch.float32"):
        _check(torch.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match="3 experts per token, the model routes to top_k=2"):
        _check(torch.zeros((2, 3, 3), dtype=torch.int16))
    with pytest.raises(ValueError, match="routing for 4 layers, the model has 3"):
        _check(torch.zeros((2, 4, 2), dtype=torch.int16))


def _saved(tmp_path):
    """A checkpoint of a run with one generation in flight and its routing (step 4)."""
    sampler = ResumableBatchSampler(40, 2, seed=3)
    source = _source(1, sampler=sampler, record_routing=True)
    source.routing_model = MODEL
    _run(source, 1, 3, [])
    state = json.loads(json.dumps(source.state_dict()))
    save_file(source.routing_state(), tmp_path / "rollout_routing.safetensors")
    return state, sampler.state_dict()


def _resume(state, sampler_state, tensors):
    sampler = ResumableBatchSampler(40, 2, seed=3)
    sampler.load_state_dict(sampler_state)
    source = _source(1, rollout=_OrderedRollout(version=3), sampler=sampler, record_routing=True)
    source.routing_model = MODEL
    source.load_state_dict(state, tensors)
    return source


def test_a_checkpoints_routing_is_checked_by_value(tmp_path):
    state, sampler_state = _saved(tmp_path)
    tensors = load_file(tmp_path / "rollout_routing.safetensors")
    _resume(state, sampler_state, dict(tensors))  # as written: fine
    garbled = dict(tensors)
    garbled["step4.routing"] = tensors["step4.routing"].clone()
    garbled["step4.routing"][2, 1] = torch.tensor([1200, 3], dtype=torch.int16)  # past the last expert
    with pytest.raises(ValueError, match=r"rollout_routing.safetensors of the checkpoint \(step 4\) \(sample 0\): "
                                         r"expert ids must be \[0, 1000\).*token 2, layer 1, holds \[1200, 3\]"):
        _resume(state, sampler_state, garbled)
    garbled["step4.routing"] = tensors["step4.routing"].float()
    with pytest.raises(ValueError, match="integer expert ids, not torch.float32"):
        _resume(state, sampler_state, garbled)
    garbled = {**tensors, "step4.lengths": tensors["step4.lengths"] + 1}
    with pytest.raises(ValueError, match=r"step4.routing has shape \[\d+, 2, 2\], expected \[\d+ \(the sum of its"):
        _resume(state, sampler_state, garbled)


class _BadRollout(_OrderedRollout):
    """The rollout engine returns a routing table with an expert it does not have."""

    def wait(self, call):
        out = super().wait(call)
        if out is not None and out.routed_experts:
            out.routed_experts[1][0, 0] = torch.tensor([3, 3], dtype=torch.int16)
        return out


def test_the_rollout_engines_routing_is_checked_by_value():
    source = _source(0, rollout=_BadRollout(), record_routing=True)
    source.routing_model = MODEL
    with pytest.raises(ValueError, match=r"the routed experts the rollout engine returned \(sample 1\): a token's "
                                         r"top-2 experts must be distinct; token 0, layer 0, holds \[3, 3\]"):
        source.take(1)
