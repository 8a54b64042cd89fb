"""benchmarks/ installs as paxsearch.benchmarks: the scripts import their shared helpers (published.py,
study_run.py, one another) as `from paxsearch.benchmarks import ...`, and each still runs as
`python benchmarks/<script>.py`."""
