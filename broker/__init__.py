"""Tidemark broker: message store, consumer offset manager and gRPC services.

Every broker process (`tidemark broker`, `tidemark namesrv`, `python -m tidemark.broker.app`) imports this
package before anything else of it, so it sets one process-wide default here: OpenBLAS, which numpy loads on
import, starts a helper thread per core that spins while the process imports the rest of the broker. The
broker uses numpy for vectorised reads and checks of records, never for linear algebra, and paid about 120 ms
of CPU per start for those threads (a quarter of a bare broker's start and stop on 2 cores). An operator's own
OPENBLAS_NUM_THREADS is kept.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
