"""Processes started by SLURM's ``srun``.

``srun`` starts one task per process and tells each ``SLURM_NTASKS`` (world size),
``SLURM_PROCID`` (global rank), ``SLURM_LOCALID`` (local rank) and ``SLURM_NODEID`` (node rank).
Rank 0 runs on the first host of the step's node list, so every task can name the rendezvous
host without talking to the others; the port comes from ``MASTER_PORT`` or is derived from the
job id. Example job script::

    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=4
    #SBATCH --gpus-per-node=4
    srun python train.py   # Trainer(devices=4, num_nodes=2)

An interactive shell (``salloc`` or ``srun --pty bash``, whose job name SLURM sets to ``bash``
or ``interactive``) is not detected: a script run there directly is a single process, and the
default :class:`LocalEnvironment` launches the others. Give such a job another name
(``--job-name``) to use ``srun`` inside it.
"""

from __future__ import annotations

import signal
import subprocess

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments._hostlist import expand_hostlist, expand_tasks_per_node
from drivetrain.plugins.environments.launched import LaunchedEnvironment, LayoutVariables

_WHO = "SLURMEnvironment"
_INTERACTIVE_JOB_NAMES = frozenset({"bash", "interactive"})
# The step's own values come first: a step may use fewer nodes or tasks than the job holds.
_NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_NUM_NODES_VARIABLES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_TASKS_PER_NODE_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def _first_set(names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get_str(name)
        if value:
            return name, value
    return None


class SLURMEnvironment(LaunchedEnvironment):
    """Reads the job layout SLURM announced to each ``srun`` task.

    Args:
        auto_requeue: on ``requeue_signal`` the run stops at the next step boundary on every rank,
            saves a checkpoint, runs ``scontrol requeue $SLURM_JOB_ID`` and exits; the requeued job
            resumes from that checkpoint (the Trainer finds it in ``default_root_dir``). Ask SLURM to
            send the signal ahead of the time limit: ``#SBATCH --signal=USR1@90`` (``B:USR1@90``
            signals the batch shell only, which does not reach the tasks).
        requeue_signal: the signal SLURM is configured to send (``SIGUSR1`` by default).
    """

    who = _WHO

    def __init__(self, auto_requeue: bool = True, requeue_signal: int | None = None) -> None:
        if not isinstance(auto_requeue, bool):
            raise TypeError(f"SLURMEnvironment(auto_requeue=...) takes True or False, got {auto_requeue!r}.")
        chosen = signal.SIGUSR1 if requeue_signal is None else requeue_signal
        valid = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
        if isinstance(chosen, bool) or not isinstance(chosen, int) or chosen not in valid:
            raise ValueError(
                f"SLURMEnvironment(requeue_signal={requeue_signal!r}) is not a signal a process can handle; pass "
                f"the one #SBATCH --signal names, e.g. signal.SIGUSR1 (the default) or signal.SIGTERM."
            )
        self.auto_requeue = auto_requeue
        self._requeue_signal = signal.Signals(chosen)

    @property
    def requeue_signal(self) -> int | None:
        """``requeue_signal`` when ``auto_requeue`` is on."""
        return self._requeue_signal if self.auto_requeue else None

    def requeue(self) -> None:
        """``scontrol requeue`` this job (an array task by its ``<array job id>_<task id>``).

        Raises:
            RuntimeError: ``scontrol`` is missing or refused; its output is in the message.
        """
        array_job, task = env.get_str("SLURM_ARRAY_JOB_ID"), env.get_str("SLURM_ARRAY_TASK_ID")
        job = f"{array_job}_{task}" if array_job and task else env.get_str("SLURM_JOB_ID")
        if not job:
            raise RuntimeError("Cannot requeue: SLURM_JOB_ID is not set, so the job to requeue is unknown.")
        try:
            result = subprocess.run(
                ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise RuntimeError(
                f"Cannot requeue SLURM job {job}: `scontrol requeue {job}` failed ({error})."
            ) from None
        if result.returncode != 0:
            raise RuntimeError(
                f"Cannot requeue SLURM job {job}: `scontrol requeue {job}` exited with code {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()}"
            )

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR`` when set, else the first host of the step's (or job's) node list."""
        address = env.get_str("MASTER_ADDR")
        if address:
            return address
        found = _first_set(_NODELIST_VARIABLES)
        if found is None:
            raise ValueError(
                f"{_WHO} needs the node list to find rank 0's host, but none of "
                f"{', '.join(_NODELIST_VARIABLES)} is set. Set MASTER_ADDR to the host of rank 0."
            )
        return expand_hostlist(found[1])[0]

    @property
    def main_port(self) -> int:
        """``MASTER_PORT`` when set, else a port derived from the job (and step) id.

        Every task derives the same port: ``10000 + crc32("<SLURM_JOB_ID>[.<SLURM_STEP_ID>]") % 22768``,
        within 10000-32767. Including the step id keeps concurrent ``srun`` steps of one job apart.
        """
        port = env.get_port("MASTER_PORT")
        if port is not None:
            return port
        job_id = env.get_str("SLURM_JOB_ID") or env.get_str("SLURM_JOBID")
        if not job_id:
            raise ValueError(
                f"{_WHO} derives the rendezvous port from SLURM_JOB_ID, which is not set. "
                "Set MASTER_PORT to a free port."
            )
        step_id = env.get_str("SLURM_STEP_ID") or env.get_str("SLURM_STEPID")
        return env.port_from_job_id(f"{job_id}.{step_id}" if step_id else job_id)

    @staticmethod
    def detect() -> bool:
        """True inside an ``srun`` task or batch job (``SLURM_NTASKS`` set), except interactive shells."""
        if not env.is_set("SLURM_NTASKS"):
            return False
        return env.get_str("SLURM_JOB_NAME") not in _INTERACTIVE_JOB_NAMES

    def layout_variables(self) -> LayoutVariables:
        return LayoutVariables(
            world_size="SLURM_NTASKS",
            global_rank="SLURM_PROCID",
            local_rank="SLURM_LOCALID",
            set_by="",
            world_size_fix="Change #SBATCH --nodes / --ntasks-per-node so they multiply to it.",
            rank_fix="Ranks under srun are assigned by SLURM; do not set them.",
        )

    def node_rank(self) -> int:
        """``SLURM_NODEID``."""
        return env.require_int("SLURM_NODEID", who=_WHO)

    def num_nodes(self) -> int:
        """The number of nodes of the step (``SLURM_STEP_NUM_NODES``), else of the job (``SLURM_NNODES``)."""
        for name in _NUM_NODES_VARIABLES:
            value = env.get_int(name, minimum=1)
            if value is not None:
                return value
        raise ValueError(f"{_WHO} expected one of {', '.join(_NUM_NODES_VARIABLES)} to be set; none is.")

    def tasks_per_node(self) -> int:
        """How many tasks SLURM runs on each node.

        Read from the step's layout (``SLURM_STEP_TASKS_PER_NODE``), else the request
        (``SLURM_NTASKS_PER_NODE``), else the job's layout (``SLURM_TASKS_PER_NODE``), else
        ``SLURM_NTASKS // SLURM_NNODES``. The layout variables look like ``"2(x3)"``.

        Raises:
            ValueError: The tasks are spread unevenly over the nodes (e.g. ``"3,2"``).
        """
        found = _first_set(_TASKS_PER_NODE_VARIABLES)
        if found is not None:
            name, value = found
            counts = set(expand_tasks_per_node(name, value))
            source = f"{name}={value}"
        else:
            nodes = self.num_nodes()
            tasks = self.world_size()
            counts = {tasks // nodes} if tasks % nodes == 0 else {tasks // nodes, tasks // nodes + 1}
            source = f"SLURM_NTASKS={tasks} on {nodes} node(s)"
        if len(counts) != 1:
            raise ValueError(
                f"SLURM spread the tasks unevenly over the nodes ({source}); every node must run the "
                "same number of processes. Request it with #SBATCH --ntasks-per-node=<devices per node>."
            )
        return counts.pop()

    def processes_per_node(self) -> int | None:
        return self.tasks_per_node()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``devices`` against the tasks per node and ``num_nodes`` against the allocation.

        Raises:
            ValueError: Either disagrees with what SLURM started.
        """
        per_node = self.tasks_per_node()
        if per_node != num_devices:
            raise ValueError(
                f"SLURM started {per_node} task(s) per node but devices={num_devices}. Set "
                f"`#SBATCH --ntasks-per-node={num_devices}` (and the same on `srun` if you pass it there), "
                f"or pass devices={per_node}."
            )
        nodes = self.num_nodes()
        if nodes != num_nodes:
            raise ValueError(
                f"SLURM allocated {nodes} node(s) but num_nodes={num_nodes}. Pass num_nodes={nodes}, or set "
                f"`#SBATCH --nodes={num_nodes}`."
            )

    def __repr__(self) -> str:
        return env.environment_repr(
            self,
            main_address=lambda: self.main_address,
            main_port=lambda: self.main_port,
            job_id=lambda: env.get_str("SLURM_JOB_ID"),
        )
