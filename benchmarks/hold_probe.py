"""What holding the stream changes in a timed CUDA-graph replay (``tvm_canary.timing.median_us``'s
``hold``): an empty kernel captured 1, 4, 8 and 32 times in a graph, each graph timed 12 times (medians
of 15 replays, µs per launch) unheld and held; prints the median, min and max of each.

    python benchmarks/hold_probe.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options; -h describes it
    if not torch.cuda.is_available():
        print("kv-canary: hold_probe.py needs a CUDA GPU and torch sees none; run it on a GPU host", file=sys.stderr)
        return 2
    sys.path.insert(0, HERE)
    import floors

    from tvm_canary import timing
    from tvm_canary.runtime import targets

    empty = floors.compile_cuda(floors.empty(), targets.cuda_arch(0))
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    print(f"{torch.cuda.get_device_name(0)}: empty kernel, µs per launch over 12 timings of 15 replays")
    for launches in (1, 4, 8, 32):
        graph = timing.capture([lambda: empty(flag)] * launches)
        for hold in (False, True):
            times = [timing.median_us(graph.replay, 15, hold=hold) / launches for _ in range(12)]
            print(f"{launches:3} launches {'held  ' if hold else 'unheld'}: median {statistics.median(times):6.3f}, "
                  f"min {min(times):6.3f}, max {max(times):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
