"""RewardExecutor: result normalization, and containment of reward functions that misbehave.

Each misbehaving function (unbounded allocation, forking, reading secrets, dying, hanging,
cancelling the alarm) is contained and counted, and the batch finishes within about one
timeout. Checked against the executor before this change (a multiprocessing.Pool with
inherited environment and no limits): the secret and GPU were visible, the forked
children outlived ``close()``, a dying worker stalled the batch until the backstop (30 s +),
the allocation ran into the machine's memory, and there was no worker recycling.
"""

import os
import signal
import time

import pytest

from verl_mp.reward.executor import RewardExecutor, normalize_result
from verl_mp.reward.registry import get_reward_fn
from verl_mp.reward.worker_proc import WorkerLimits, worker_env

pytestmark = pytest.mark.unit

PLUGIN = '''
import os, resource, signal, subprocess, time

def fine(*args):
    return 1.0

def pid(*args):
    return float(os.getpid())

def hog(*args):
    blocks = []
    while True:
        blocks.append(bytearray(64 << 20))

def forks(pid_file, *args):
    # a direct child, and a grandchild whose parent exits (re-parented, same process group)
    child = subprocess.Popen(["sleep", "300"])
    grandchild = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    with open(pid_file, "w") as f:
        f.write(f"{child.pid} {grandchild.stdout.strip()}")
    return 1.0

def forks_and_hangs(pid_file, *args):
    forks(pid_file)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # like C code that never returns
    time.sleep(300)

def environment(*args):
    environ = open("/proc/self/environ", "rb").read().split(b"\\0")
    names = {item.split(b"=", 1)[0].decode() for item in environ if item}
    return {"score": 1.0, "secret_in_proc": float("HF_TOKEN" in names or "WANDB_API_KEY" in names),
            "secret_in_os": float(any(k in os.environ for k in ("HF_TOKEN", "WANDB_API_KEY"))),
            "judge_key": float(os.environ.get("JUDGE_API_KEY") == "ok"),
            "gpu_hidden": float(os.environ.get("CUDA_VISIBLE_DEVICES") == "")}

def limits(*args):
    out = {"score": 1.0}
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_NPROC"):
        out[name] = float(resource.getrlimit(getattr(resource, name))[0])
    return out

def exits(*args):
    os._exit(3)

def sigkills_itself(*args):
    os.kill(os.getpid(), signal.SIGKILL)

def cancels_alarm_and_returns(*args):
    signal.setitimer(signal.ITIMER_REAL, 0)
    time.sleep(0.8)
    return 1.0

def cancels_alarm_and_hangs(*args):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(300)

def spins(*args):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass
'''


@pytest.fixture(scope="module")
def fns(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "plug.py"
    path.write_text(PLUGIN)
    names = ("fine", "pid", "hog", "forks", "forks_and_hangs", "environment", "limits", "exits",
             "sigkills_itself", "cancels_alarm_and_returns", "cancels_alarm_and_hangs", "spins")
    return {name: get_reward_fn(f"{path}:{name}") for name in names}


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids, timeout_s=5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_normalize_result():
    assert normalize_result(1) == (1.0, {})
    assert normalize_result({"score": 0.5, "acc": True, "pred": "7"}) == (0.5, {"acc": 1.0})
    for bad in ({"acc": 1.0}, None, "1.0", True, float("inf")):
        with pytest.raises((TypeError, ValueError)):
            normalize_result(bad)


def test_unbounded_allocation_hits_the_memory_limit(fns):
    executor = RewardExecutor(num_workers=1, timeout_s=20, limits=WorkerLimits(memory_mb=512))
    try:
        outcomes = executor.run([(fns["hog"], ()), (fns["fine"], ())])
    finally:
        executor.close()
    assert outcomes[0].status == "error" and "MemoryError" in outcomes[0].message
    assert outcomes[1].status == "ok"


def test_limits_are_applied_in_the_worker(fns):
    limits = WorkerLimits(memory_mb=1024, cpu_s=120, open_files=64, processes=5000)
    executor = RewardExecutor(num_workers=1, timeout_s=20, limits=limits)
    try:
        [outcome] = executor.run([(fns["limits"], ())])
    finally:
        executor.close()
    assert outcome.extras == {"RLIMIT_AS": 1024.0 * (1 << 20), "RLIMIT_CPU": 120.0, "RLIMIT_NOFILE": 64.0,
                              "RLIMIT_NPROC": 5000.0}


def test_children_die_with_the_worker(fns, tmp_path):
    """Children a reward function leaves behind die when the pool closes; children of a hung
    call die with its killed worker."""
    executor = RewardExecutor(num_workers=1, timeout_s=3.0, kill_grace_s=0.5)
    try:
        assert executor.run([(fns["forks"], (str(tmp_path / "a"),))])[0].status == "ok"
        left = [int(p) for p in (tmp_path / "a").read_text().split()]
        assert all(alive(p) for p in left)  # the call returned; its children still run
        start = time.monotonic()
        hung = executor.run([(fns["forks_and_hangs"], (str(tmp_path / "b"),)), (fns["fine"], ())])
        assert time.monotonic() - start < 15.0  # 3 s timeout + 0.5 s grace + a new worker's start
        assert [o.status for o in hung] == ["timeout", "ok"]
        assert wait_dead([int(p) for p in (tmp_path / "b").read_text().split()])
    finally:
        executor.close()
    assert wait_dead(left)


def test_environment_has_no_secrets_and_no_gpu(fns, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret")
    monkeypatch.setenv("JUDGE_API_KEY", "ok")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    executor = RewardExecutor(num_workers=1, timeout_s=20, pass_env=["JUDGE_API_KEY"])
    try:
        [outcome] = executor.run([(fns["environment"], ())])
    finally:
        executor.close()
    assert outcome.status == "ok", outcome.message
    assert outcome.extras == {"secret_in_proc": 0.0, "secret_in_os": 0.0, "judge_key": 1.0, "gpu_hidden": 1.0}


def test_worker_env_is_an_allowlist():
    env = worker_env({"HF_TOKEN": "x", "AWS_SECRET_ACCESS_KEY": "x", "RAY_AUTH_TOKEN": "x", "MY_KEY": "x",
                      "MAX_NEW_TOKENS": "5", "PATH": "/bin", "OMP_NUM_THREADS": "4"})
    assert env["PATH"] == "/bin" and "MAX_NEW_TOKENS" not in env and env["OMP_NUM_THREADS"] == "4"
    assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "RAY_AUTH_TOKEN", "MY_KEY"} & set(env)
    assert env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("name,why", [("exits", "exited with code 3"), ("sigkills_itself", "SIGKILL")])
def test_dead_worker_is_seen_at_once_and_the_batch_goes_on(fns, name, why):
    executor = RewardExecutor(num_workers=1, timeout_s=60)
    try:
        start = time.monotonic()
        outcomes = executor.run([(fns["fine"], ()), (fns[name], ()), (fns["fine"], ()), (fns["fine"], ())])
        elapsed = time.monotonic() - start
    finally:
        executor.close()
    assert [o.status for o in outcomes] == ["ok", "error", "ok", "ok"]
    assert why in outcomes[1].message
    assert elapsed < 20.0  # two worker starts; far below one 60 s timeout, no backstop


def test_idle_worker_killed_between_batches_is_replaced(fns):
    executor = RewardExecutor(num_workers=1, timeout_s=10)
    try:
        [first] = executor.run([(fns["pid"], ())])
        os.kill(int(first.score), signal.SIGKILL)  # e.g. the OOM killer while the step trains
        assert wait_dead([int(first.score)])
        outcomes = executor.run([(fns["pid"], ()), (fns["fine"], ())])
    finally:
        executor.close()
    assert [o.status for o in outcomes] == ["ok", "ok"] and outcomes[0].score != first.score


def test_cancelled_alarm_still_times_out(fns):
    """A library that cancels the alarm: a late result counts as a timeout; a call that never
    returns is killed by the parent's watchdog at timeout + grace."""
    executor = RewardExecutor(num_workers=1, timeout_s=0.3, kill_grace_s=2.0)
    try:
        start = time.monotonic()
        outcomes = executor.run([(fns["cancels_alarm_and_returns"], ()), (fns["cancels_alarm_and_hangs"], ()),
                                 (fns["fine"], ())])
        elapsed = time.monotonic() - start
    finally:
        executor.close()
    assert [o.status for o in outcomes] == ["timeout", "timeout", "ok"]
    assert "cancelled the alarm" in outcomes[0].message and "killed" in outcomes[1].message
    assert elapsed < 15.0  # 0.8 s + 2.3 s + a new worker's start, not the 300 s sleeps


def test_workers_are_recycled(fns):
    executor = RewardExecutor(num_workers=1, timeout_s=20, max_calls_per_worker=2)
    try:
        outcomes = executor.run([(fns["pid"], ())] * 5)
        workers = {o.score for o in outcomes}
    finally:
        executor.close()
    assert len(workers) == 3 and [o.score for o in outcomes][:2] == [outcomes[0].score] * 2
    assert wait_dead([int(p) for p in workers])


def test_rlimit_cpu_ends_a_spinning_worker(fns):
    """RLIMIT_CPU as the last line (here before the watchdog): the kernel ends the worker and
    the call counts as an error."""
    executor = RewardExecutor(num_workers=1, timeout_s=30, limits=WorkerLimits(cpu_s=2))
    try:
        [outcome] = executor.run([(fns["spins"], ())])
    finally:
        executor.close()
    assert outcome.status == "error" and "SIGXCPU" in outcome.message, outcome.message


def test_limit_config_is_validated():
    from verl_mp.config.schema import RewardConfig

    with pytest.raises(ValueError, match="reward.memory_limit_mb=0"):
        RewardConfig(memory_limit_mb=0)
    with pytest.raises(ValueError, match="reward.max_calls_per_worker=0"):
        RewardConfig(max_calls_per_worker=0)
