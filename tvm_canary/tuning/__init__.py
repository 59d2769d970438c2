"""Per-device autotuning with MetaSchedule.

* ``workloads``: size buckets, their stand-in functions (carrying the kernel hash), valid cases;
* ``measure``: the builder and runner hooks MetaSchedule's workers call;
* ``driver``: tuning one workload into a database (the runner is pluggable);
* ``command``: the ``tvm-canary tune`` command;
* ``keys``: device keys and where databases are looked up and written;
* ``apply``: choosing a launch's geometry from the device's database at load;
* ``store``: database folders plain or packed (the committed ones gzip-compressed);
* ``merge``: ``tvm-canary tune-merge``, merging databases of one device key;
* ``restamp``: re-stamping a database's kernel hashes after a code-preserving kernel change.
"""
