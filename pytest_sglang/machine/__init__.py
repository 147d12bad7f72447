"""Facts about the machine a figure was measured on, a leaf that bench, baseline, launch, server and telemetry
import and that imports none of them: ``facts`` (the fingerprint that selects a baseline, the commit) and
``gpus`` (what each GPU reads now, and which processes hold its memory)."""
