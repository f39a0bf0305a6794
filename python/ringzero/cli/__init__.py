"""The command lines (`ringzero train|bench`, `python -m ringzero ...`, dispatched by ringzero/__main__.py)
and what only they use: starting ranks (launch.py), the benchmark tables, the compare chart."""
