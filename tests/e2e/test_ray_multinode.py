"""Multi-node placement on a real Ray cluster of two raylets ("nodes") on this machine.

`ray.cluster_utils.Cluster` starts a head node and a second node, each with 2 CPUs and
its own node id. The real CLI joins that cluster through RAY_ADDRESS and runs GRPO with
``trainer.nnodes=2 trainer.nproc=1``: the actor pool is ``[1, 1]``, so its two ranks
(Megatron TP=2 + vLLM TP=2 over gloo) must land on different nodes. Each node could host
both ranks (2 CPUs), so only the placement code keeps them apart. Each rank reports the
node id it runs on, and the driver logs it.

What this does not prove: a cluster of several hosts (every node here shares one IP
address, one file system and one shared-memory namespace).
"""

import re
import shutil
import tempfile

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e

CPUS_PER_NODE = 2
NODE_LINE = re.compile(r"actor_rollout_ref rank (\d+) on node ([0-9a-f]+)")


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node plus one more node; shut down even when the test fails."""
    from ray.cluster_utils import Cluster

    # Ray writes its address file and sockets under RAY_TMPDIR: a directory of our own keeps
    # another test's `ray.init()` from finding (and joining) this cluster. Short path:
    # Unix socket paths are limited to ~107 characters.
    temp_dir = tempfile.mkdtemp(prefix="vmp-ray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", temp_dir)
        cluster = None
        try:
            head = {"num_cpus": CPUS_PER_NODE, "include_dashboard": False}
            cluster = Cluster(initialize_head=True, head_node_args=head)
            cluster.add_node(num_cpus=CPUS_PER_NODE)
            cluster.wait_for_nodes()
            mp.setenv("RAY_ADDRESS", cluster.address)
            yield cluster
        finally:
            if cluster is not None:
                cluster.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def multinode_run(ray_cluster, tiny_run_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("multinode") / "run"
    layout = ["trainer.nnodes=2", "trainer.nproc=1", "actor.megatron.tensor_model_parallel_size=2",
              "rollout.tensor_model_parallel_size=2"]
    run_cli(["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, "ray"), *layout],
                   timeout=300)
    node_ids = {n.node_id for n in ray_cluster.list_all_nodes()}
    return out, (out / "logs" / "driver.log").read_text(), node_ids  # the console is quiet; the log is full


def test_grpo_steps_complete_across_nodes(multinode_run):
    out, _, _ = multinode_run
    steps = {}
    for row in read_jsonl(str(out / "metrics.jsonl")):
        steps.setdefault(row["step"], {}).update(row)
    assert set(steps) >= {0, 1, 2}
    for step in (1, 2):
        for key in ("actor/pg_loss", "actor/grad_norm", "reward/score/mean", "timing/step_s"):
            assert steps[step].get(key) is not None, (step, key)
        # Megatron TP=2 and vLLM TP=2 span the two nodes and still agree after each sync
        assert steps[step]["rollout/logprob_diff_max"] < 1e-4
    assert (out / "checkpoints" / "global_step_2" / "meta.json").exists()


def test_ranks_run_on_different_nodes(multinode_run):
    _, log, cluster_nodes = multinode_run
    placed = dict(NODE_LINE.findall(log))  # rank -> node id, as each worker reported it
    assert set(placed) == {"0", "1"}, log[-3000:]
    assert placed["0"] != placed["1"]
    assert set(placed.values()) == cluster_nodes


def test_pool_needs_a_node_per_entry(ray_cluster):
    """`place_pool` directly: one bundle per node entry, each on a node of its own; a pool
    with more node entries than the cluster has nodes fails with the nodes it found."""
    import ray
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from verl_mp.workers.ray_group import place_pool

    ray.init(address=ray_cluster.address)
    try:
        pg = place_pool("critic", [1, 1], use_gpu=False, timeout_s=60)
        nodes = placement_group_table(pg)["bundles_to_node_id"]
        remove_placement_group(pg)
        assert len(set(nodes.values())) == 2
        with pytest.raises(RuntimeError, match=r"critic pool \[1, 1, 1\].*needs 3 different nodes"):
            place_pool("critic", [1, 1, 1], use_gpu=False, timeout_s=2)
    finally:
        ray.shutdown()
