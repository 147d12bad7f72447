"""Launching: the plan (command, environment, fingerprint), the process tree and its teardown, ports, the reaper.

    plan.py     LaunchPlan, plan_launch: from a profile to what to run
    process.py  ServerProcess: own session, log file, group kill, owner-token sweep
    ports.py    free ports, a busy port refused, waiting for release
    reaper.py   `python -m pytest_sglang.launch.reaper`: kills the tree if pytest itself dies
"""
