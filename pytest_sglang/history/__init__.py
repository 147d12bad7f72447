"""The run history: every run's figures in an SQLite store (``store``), grouped into series whose steps are
found by change-point detection (``steps``, over ``pytest_sglang.stats.changepoints``);
``python -m pytest_sglang.history PATH`` prints them. Knows nothing about pytest."""
