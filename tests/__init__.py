"""The platform's test suite.

`SUITE_ENV` is the environment the suite started with, taken before anything imports torch (whose
import adds KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK and TORCHINDUCTOR_CACHE_DIR to os.environ): the
servers and commands the suite starts get it, as they would from an operator's shell.
"""

import os

if "PYTEST_XDIST_WORKER" in os.environ:
    # `make test` runs two workers on two cores: one thread each, not two OpenMP pairs spinning
    # against each other's (servers and commands started by a worker inherit it)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

SUITE_ENV = dict(os.environ)
