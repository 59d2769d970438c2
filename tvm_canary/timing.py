"""GPU timing: the one method behind every kernel time tvm_canary reports on a CUDA GPU.

The tuner (``tuning/measure.run_case``) and the benchmarks (``benchmarks/``) time the same way, so a
geometry the tuner finds faster is faster in the benchmark's terms too: the launches are captured in
a CUDA graph (no host launch cost between them, as in a serving engine's graph) and the graph is
replayed; a time is the median over replays of CUDA-event time per replay, divided by the launches
it holds. ``interleaved_us`` replays several graphs in rounds (A, B, C, A, B, C, ...) in one process,
``ab_time_us`` two of them, so that run-to-run noise cannot pass for a difference between them.
"""

from __future__ import annotations

import statistics

import torch

AB_ROUNDS = 4  # rounds of (A, B) in an interleaved comparison


def median_us(fn, iters: int) -> float:
    """Median CUDA-event µs of ``fn()`` (on the current stream) over ``iters`` calls."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def capture(calls) -> torch.cuda.CUDAGraph:
    """A CUDA graph replaying ``calls`` (zero-argument launches on torch's current stream) once each,
    after an eager warm-up, replayed three times before it is returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, launches: int, iters: int) -> float:
    """Median µs per launch over ``iters`` replays of a graph holding ``launches`` launches."""
    return median_us(graph.replay, iters) / launches


def graph_time_us(calls, iters: int = 15) -> float:
    """µs per launch of ``calls`` captured in one graph (``replay_us``)."""
    return replay_us(capture(calls), len(calls), iters)


def interleaved_us(arms: dict, iters: int = 7, rounds: int = AB_ROUNDS) -> dict:
    """Interleaved arms: every arm's calls captured in a graph, then ``rounds`` rounds replaying each
    arm ``iters`` times in turn (A, B, C, A, B, C, ...), so drift during the run reaches every arm
    alike. Returns {arm: its rounds' times}, µs per launch."""
    graphs = {name: (capture(calls), len(calls)) for name, calls in arms.items()}
    times: dict = {name: [] for name in arms}
    for _ in range(rounds):
        for name, (graph, launches) in graphs.items():
            times[name].append(replay_us(graph, launches, iters))
    return times


def ab_time_us(calls_a, calls_b, iters: int = 7, rounds: int = AB_ROUNDS):
    """Interleaved A/B (``interleaved_us``). Returns (median of A's rounds, median of B's rounds, A's
    rounds, B's rounds), µs per launch."""
    times = interleaved_us({"a": calls_a, "b": calls_b}, iters, rounds)
    return statistics.median(times["a"]), statistics.median(times["b"]), times["a"], times["b"]
