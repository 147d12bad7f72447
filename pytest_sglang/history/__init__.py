"""The run history: a store of every run's figures and the steps found in its series."""
