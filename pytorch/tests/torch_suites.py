"""Runs several torch suites one after another in the same processes:

    launch.py -n N torch_suites.py torch_collectives.py torch_ddp.py ...

Each process then starts Python and imports torch once (about a second of
CPU) instead of once per suite, and joins the groups once. The suites' cases,
their order and their checks are those each runs alone (launch.py -n N
torch_ddp.py), which stays the way to run one. A suite that ends its
processes itself (torch_errors.py, whose last rank dies on purpose) comes last.
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import troupe_test  # noqa: E402

troupe_test.several = True
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
gloo_group = troupe_test.init()[2]
troupe_test.several = False
troupe_test.finish(gloo_group)
