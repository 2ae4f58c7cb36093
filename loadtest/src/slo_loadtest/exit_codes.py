"""Exit codes of every ``slo-loadtest`` command (one table, so none means two things).

* 0 pass: the verdict passed.
* 1 fail: the SLO verdict failed (the required rate was not met; with no ``--require-rate``,
  some rate failed).
* 2 usage: bad arguments or input; for ``k8s``: no usable kubeconfig, or the API server refused
  the request (namespace not found, Job already exists, not allowed).
* 3 incomplete: the sweep did not finish (server unreachable or died, guidellm failed,
  interrupted) and the report is partial; or it finished but its verdict is ``inconclusive``:
  it hangs on a rate where the client fell behind (the load generator could not keep the
  constant rate, so that rate was not judged; no rate failed outright where it mattered). For
  ``k8s``: the API server cannot be reached, or the Job's results are not there (yet).
"""

from __future__ import annotations

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
