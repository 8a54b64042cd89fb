"""benchmarks/ installs as paxsearch.benchmarks: the scripts import their shared helpers (published.py,
study_run.py, one another) as `from paxsearch.benchmarks import ...`, and each still runs as
`python benchmarks/<script>.py`. An environment installed (`pip install -e .`) from a checkout
before benchmarks/ was a package, such as a MaxText venv (bench_maxtext_compile.py), needs that
install again to find paxsearch.benchmarks."""
