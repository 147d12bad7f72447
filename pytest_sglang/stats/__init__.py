"""Statistics in pure Python, a leaf that the comparison engine (baseline/) and the run history (history/) both
import and that imports neither: ``inference`` (rank tests, their intervals, Student's t) and ``changepoints``
(E-divisive means with its permutation test)."""
