"""Launching: the plan (command, environment, fingerprint), the process tree and its teardown, ports, the reaper.

    plan.py     LaunchPlan, plan_launch: from a profile to what to run
    process.py  ServerProcess: own session, log file, group kill, owner-token sweep
    ports.py    free ports, a busy port refused, waiting for release
    reaper.py   `python -m pytest_sglang.launch.reaper`: kills the tree if pytest itself dies
    release.py  a stopped server lets go of its GPUs and port;  members.py  the tree's members, who died first
    logdir.py   private logs, old ones pruned (who holds GPU memory: pytest_sglang.machine.gpus)
    remote.py   an ssh host (agent/ runs there, ssh_errors.py reads ssh's stderr, remote_gpus.py reads
                its GPUs through the agent)
    slurm.py    the srun step over SLURM nodes (srun_log.py reads what srun said: its cause, each task's end)
"""
