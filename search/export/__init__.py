"""A trial's config in other trainers' terms: MaxText overrides (maxtext.py), a Paxml experiment
class (paxml.py). Pure functions of a TrainConfig and the target it was planned for; `paxsearch
export` (search/cli/export.py) reads the stored trial and writes their text."""
