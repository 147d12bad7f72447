"""Readiness as composed checks: each origin lists what its startup waits on, and server/ready.py's one loop
polls that list.

One record of optional fields, read by one loop full of None checks, let an origin's gaps go unnoticed (the
nodes of a SLURM profile that no check looked at); a check that is composed is judged, one that is not cannot
be half-judged, and each check tells its own failure in its own words.

    check.py    the protocol, the observations, who a message names (Subject, Server), the deadline
    probe.py    the HTTP probe and the check that asks it
    log.py      the server's own log: its crash, its ready line
    tree.py     its process tree: its exit (per node where srun says how each ended), a needed member's death
    peers.py    the other parts that must be up too: SLURM nodes, fleet members; their failures and silence
    compose.py  what each origin composes, and how its progress is told
"""
