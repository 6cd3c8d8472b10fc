"""Which GPUs each run gets, without a GPU: local submitit tasks on distinct GPU groups, K runs per GPU checked against
and capped at 1/K of its memory, --gpus-per-run forwarded to the launchers (0: CPU) or chosen by rule, and a sweep's
parent that never initialises CUDA (its workers own the GPUs). GPUs are faked where ablate counts them."""

import subprocess

import pytest
import torch

from ablate import rundir
from ablate.config import ConfigError
from ablate.cost import memory
from ablate.launch import slurm
from ablate.launch import sweep
from ablate.setup.experiment import load_checked
from ablate.training import parallel
from conftest import TINY, cli_in_process

# ---------------------------------------------------------------------------------------------------------------
# local submitit tasks: their own GPUs


def test_local_tasks_get_distinct_gpu_groups_round_robin():
    ids = ["0", "1", "2", "3"]
    assert [slurm.local_job_gpus(ids, 1, k) for k in range(5)] == [["0"], ["1"], ["2"], ["3"], ["0"]]
    assert [slurm.local_job_gpus(ids, 2, k) for k in range(3)] == [["0", "1"], ["2", "3"], ["0", "1"]]
    assert slurm.local_job_gpus(["4", "6", "7"], 2, 1) == ["4", "6"]  # the ids visible here, one group (7 unused)
    assert slurm.local_job_gpus(ids, 0, 2) == []  # CPU
    assert slurm.local_job_gpus([], 2, 0) == []  # no GPU here: the processes train on CPU (gloo)
    with pytest.raises(ConfigError, match="--gpus-per-run: 3, but 2 GPUs are visible; allowed: 1 to 2"):
        slurm.local_job_gpus(["0", "1"], 3, 0)


def test_local_sharing_counts_the_tasks_on_each_group():
    assert slurm.local_sharing(3, 1, ["0", "1", "2", "3"]) == 1
    assert slurm.local_sharing(5, 1, ["0", "1", "2", "3"]) == 2
    assert slurm.local_sharing(3, 2, ["0", "1", "2", "3"]) == 2
    assert slurm.local_sharing(8, 0, ["0"]) == 1 and slurm.local_sharing(8, 1, []) == 1


class FakeExecutor:
    """What _submit_locally asks of submitit's LocalExecutor: the visible GPUs each task is submitted with."""

    def __init__(self):
        self.visible, self.tasks = None, []

    def update_parameters(self, visible_gpus):
        self.visible = visible_gpus

    def submit(self, task, run, out_root):
        self.tasks.append((task, run["name"], self.visible))
        return len(self.tasks)


def test_local_launcher_submits_each_task_on_its_own_gpus(monkeypatch):
    runs = [[run] for run in load_checked(TINY, seeds=[0, 1])[:3]]  # three tasks, a run each
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0", "1", "2", "3"])
    executor = FakeExecutor()
    jobs = slurm._submit_locally(executor, runs, "out", {"gpus_per_run": 2, "max_requeues": 0}, 1, None)
    assert jobs == [1, 2, 3]
    assert [visible for _, _, visible in executor.tasks] == [(0, 1), (2, 3), (0, 1)]
    assert executor.tasks[0][0].gpu_memory_fraction == 0.5  # two tasks on GPUs 0,1 at once: half each

    cpu = FakeExecutor()
    slurm._submit_locally(cpu, runs, "out", {"gpus_per_run": 0, "max_requeues": 0}, 1, None)
    assert [visible for _, _, visible in cpu.tasks] == [()] * 3  # gpus_per_node=0: submitit hides every GPU
    assert cpu.tasks[0][0].gpu_memory_fraction is None

    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["GPU-5d3c", "GPU-77aa"])
    with pytest.raises(ConfigError, match="names GPUs by UUID; allowed: GPU indices"):
        slurm._submit_locally(FakeExecutor(), runs, "out", {"gpus_per_run": 1, "max_requeues": 0}, 1, None)


# ---------------------------------------------------------------------------------------------------------------
# gpus_per_run: given, forwarded, or chosen


def test_gpus_per_run_rule(monkeypatch):
    on = load_checked(TINY)  # train.device='auto'
    monkeypatch.setattr(slurm, "_sinfo_partitions", lambda: None)  # no SLURM here
    monkeypatch.setattr(sweep, "visible_gpus", lambda: [])
    assert slurm.resolve_gpus_per_run({"gpus_per_run": 3}, on, local=True) == (3, "")
    assert slurm.resolve_gpus_per_run({}, on, local=True) == (0, "no CUDA GPU visible here: CPU")
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0", "1"])
    assert slurm.resolve_gpus_per_run({}, on, local=True) == (1, "this machine sees 2 CUDA GPU(s)")
    cpu_runs = load_checked(TINY, overrides={"train.device": "cpu"})
    assert slurm.resolve_gpus_per_run({}, cpu_runs, local=True)[0] == 0
    # on a cluster the partition's GRES decides, whatever the login node has
    monkeypatch.setattr(slurm, "_sinfo_partitions", lambda: "cpu*|(null)\ngpu|gpu:a100:4\n")
    assert slurm.resolve_gpus_per_run({"partition": "gpu"}, on, local=False) == (
        1,
        "partition gpu offers GPUs (sinfo's GRES)",
    )
    assert slurm.resolve_gpus_per_run({}, on, local=False)[0] == 0  # the default partition (cpu*) has none


def test_partition_gres_from_sinfo():
    text = "debug*|(null)\ngpu|gpu:h100:8(S:0-1)\ngpu|gpu:a100:4\nbig|(null)\n"
    assert slurm.partition_has_gpus(text, "gpu") is True
    assert slurm.partition_has_gpus(text, "big") is False
    assert slurm.partition_has_gpus(text, None) is False  # debug*, the default
    assert slurm.partition_has_gpus(text, "missing") is None
    assert slurm.partition_has_gpus(None, "gpu") is None  # no sinfo


@pytest.fixture
def submitted(monkeypatch):
    """`ablate run --launcher local` up to submission: the options slurm.submit would get."""
    calls = []

    def fake_submit(runs, out, options, local=False, wait=True, experiment_file=None, stacks=None):
        calls.append(dict(options))
        return ["finished"] * len(runs)

    monkeypatch.setattr(slurm, "submit", fake_submit)
    monkeypatch.setattr(sweep, "prepare_all", lambda runs, d=None: None)
    return calls


@pytest.mark.parametrize(
    "given, gpus, expected",
    [
        (["--gpus-per-run", "1"], [], 1),  # forwarded, even where no GPU is visible here
        (["--gpus-per-run", "0"], ["0", "1"], 0),  # explicit CPU on a GPU machine
        (["--slurm", "gpus_per_run=2"], [], 2),
        (["--gpus-per-run", "2", "--slurm", "gpus_per_run=2"], [], 2),
        ([], ["0", "1"], 1),  # auto: this machine has GPUs
        ([], [], 0),  # auto: it has none
    ],
)
def test_gpus_per_run_reaches_the_launcher(tmp_path, monkeypatch, submitted, given, gpus, expected):
    monkeypatch.setattr(sweep, "visible_gpus", lambda: gpus)
    cli_in_process("run", TINY, "--out", tmp_path, "--launcher", "local", *given)
    assert submitted[0]["gpus_per_run"] == expected


def test_disagreeing_gpu_counts_and_cuda_runs_on_cpu_are_refused(tmp_path, monkeypatch, submitted):
    both = cli_in_process(
        "run",
        TINY,
        "--out",
        tmp_path,
        "--launcher",
        "local",
        "--gpus-per-run",
        "1",
        "--slurm",
        "gpus_per_run=2",
        check=False,
    )
    assert both.returncode == 2 and "--gpus-per-run 1 and --slurm gpus_per_run=2: they disagree" in both.stderr
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # train.device=cuda loads
    cuda = cli_in_process(
        "run", TINY, "--out", tmp_path, "--gpus-per-run", "0", "--set", "train.device=cuda", check=False
    )
    assert cuda.returncode == 2 and "--gpus-per-run 0: trains on CPU, but mha sets train.device='cuda'" in cuda.stderr
    assert not submitted


# ---------------------------------------------------------------------------------------------------------------
# K runs per GPU; the parent of a sweep


def test_slots_sharing_a_gpu_cap_each_worker_at_its_share(tmp_path):
    slots = sweep.machine_slots(None, 2, 1, gpu_ids=["0", "1"], cores=8)
    assert [(s.gpus, s.sharing) for s in slots] == [(["0"], 2), (["0"], 2), (["1"], 2), (["1"], 2)]
    job = sweep.Job([1], [None], tmp_path / "log", tmp_path / "result.json")
    env = sweep._env(slots[0], job)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env[rundir.GPU_SHARE_ENV] == "0.5"
    alone = sweep._env(sweep.machine_slots(None, 1, 1, gpu_ids=["0", "1"], cores=8)[1], job)
    assert alone["CUDA_VISIBLE_DEVICES"] == "1" and rundir.GPU_SHARE_ENV not in alone
    cpu = sweep.machine_slots(2, 1, 0, gpu_ids=["0", "1"], cores=8)  # --gpus-per-run 0 on a GPU machine
    assert [s.gpus for s in cpu] == [[], []] and sweep._env(cpu[0], job)["CUDA_VISIBLE_DEVICES"] == ""
    assert not sweep.in_this_process(sweep.machine_slots(None, 1, 0, gpu_ids=["0"], cores=8), ["0"])
    assert sweep.in_this_process(sweep.machine_slots(None, 1, 0, gpu_ids=[], cores=8), [])
    with pytest.raises(ConfigError, match="--runs-per-gpu 2 and --gpus-per-run 0: choose one"):
        sweep.machine_slots(None, 2, 0, gpu_ids=["0"], cores=8)


def test_runs_spread_over_the_gpus_before_they_double_up():
    slots = sweep.machine_slots(None, 2, 1, gpu_ids=["0", "1"], cores=8)
    taken = []
    while slot := sweep._next_free_slot(slots):
        slot.job = object()  # busy
        taken.append(slot.gpus)
    assert taken == [["0"], ["1"], ["0"], ["1"]]
    slots[0].job = None  # a run on GPU 0 ended
    assert sweep._next_free_slot(slots) is slots[0]


def test_a_worker_applies_its_memory_share_on_its_own_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    monkeypatch.delenv(rundir.GPU_SHARE_ENV, raising=False)
    parallel.apply_gpu_memory_share(torch.device("cuda", 0))
    assert calls == []  # alone on its GPU: no cap
    monkeypatch.setenv(rundir.GPU_SHARE_ENV, "0.25")
    parallel.apply_gpu_memory_share(torch.device("cuda", 1))  # the device init_distributed chose (local_gpu_index)
    assert calls == [(0.25, torch.device("cuda", 1))]


def _no_cuda_here(monkeypatch):
    """A machine with 2 GPUs as ablate counts them, where anything that would initialise CUDA in this process
    (or join a process group) fails the test."""

    def forbidden(name):
        def call(*args, **kwargs):
            raise AssertionError(f"the sweep's parent called {name}")

        return call

    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()  # dynamo's cached table of torch functions: built from the real ones
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("_lazy_init", "init", "set_device", "current_device", "get_device_properties", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, forbidden(f"torch.cuda.{name}"))
    monkeypatch.setattr(parallel, "init_distributed", forbidden("init_distributed"))


@pytest.fixture
def side_by_side(monkeypatch):
    """The slots a sweep hands its workers (none start), on a faked 2-GPU machine of `total` bytes per GPU."""
    seen, probes = [], []

    def fake_run_side_by_side(runs, out, slots, report, experiment_file=None, stacks=None):
        seen.append(slots)
        return ["finished"] * len(runs)

    def probe(total):
        def run(command, **kwargs):  # the child process that reads the GPU's memory
            probes.append(command)
            return subprocess.CompletedProcess(command, 0, f"{total}\n", "")

        monkeypatch.setattr(memory.subprocess, "run", run)

    _no_cuda_here(monkeypatch)
    monkeypatch.setattr(sweep, "run_side_by_side", fake_run_side_by_side)
    return seen, probes, probe


def test_the_sweep_parent_never_initialises_cuda(tmp_path, side_by_side):
    seen, probes, probe = side_by_side
    probe(80 * 2**30)
    result = cli_in_process("run", TINY, "--out", tmp_path, "--runs-per-gpu", "2")
    assert result.returncode == 0, result.stderr
    assert [(s.gpus, s.sharing) for s in seen[0]] == [(["0"], 2), (["0"], 2), (["1"], 2), (["1"], 2)]
    assert "each capped at 1/2 of its memory" in result.stdout
    assert "get_device_properties" in probes[0][-1]  # the memory was read in a child process
    assert not torch.cuda.is_initialized()


def test_each_run_is_checked_against_its_share_of_the_gpu(tmp_path, side_by_side):
    seen, _, probe = side_by_side
    needs = memory.estimate_memory(load_checked(TINY, only=["mha"])[0], 1).total
    probe(int(needs * 1.5))  # one run fits the GPU, two do not fit it together
    assert cli_in_process("run", TINY, "--out", tmp_path).returncode == 0  # one run per GPU
    shared = cli_in_process("run", TINY, "--out", tmp_path, "--runs-per-gpu", "2", check=False)
    assert shared.returncode == 2 and "cannot fit in " + memory.format_bytes(int(needs * 1.5) // 2) in shared.stderr
    assert len(seen) == 1


def test_reading_gpu_memory_in_a_child_names_the_option_when_it_fails(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the child (a CPU build here) finds no GPU
    with pytest.raises(ConfigError, match="could not read the GPU's memory .*--device-memory 80GiB"):
        memory.device_memory_default()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert memory.device_memory_default() is None
