"""GPU timing: the one method behind every kernel time tvm_canary reports on a CUDA GPU.

The tuner (``tuning/measure.run_case``) and the benchmarks (``benchmarks/``) time the same way, so a
geometry the tuner finds faster is faster in the benchmark's terms too: the launches are captured in
a CUDA graph (no host launch cost between them, as in a serving engine's graph) and the graph is
replayed; a time is the median over replays of CUDA-event time per replay, divided by the launches
it holds. ``interleaved_us`` replays several graphs in rounds (A, B, C, A, B, C, ...) in one process,
so that run-to-run noise cannot pass for a difference between them (a tuned geometry against the
default, a kernel against its floors).

A timed replay starts behind a spin kernel that holds the stream (``HOLD_CYCLES``) while the host
records the start event and submits the graph, so the time is the graph's device time alone, as for a
graph that runs among a serving engine's other work: timed from an idle stream, a replay's time also
holds the host's submission of the graph (several µs, with the host's jitter), which weighs on
kernels of a few µs as much as their own work.
"""

from __future__ import annotations

import statistics

import torch

AB_ROUNDS = 4  # rounds of an interleaved comparison (each replays every arm in turn)
# GPU clock cycles a held timing spins before its start event (about 66 µs at the H200's 1.98 GHz):
# longer than the host takes to record an event and submit a graph of a few hundred nodes.
HOLD_CYCLES = 1 << 17


def median_us(fn, iters: int, hold: bool = False) -> float:
    """Median CUDA-event µs of ``fn()`` (on the current stream) over ``iters`` calls; with ``hold``,
    each call is issued while a spin kernel holds the stream (``HOLD_CYCLES``), so the time leaves out
    the host's cost of issuing it."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold:
            torch.cuda._sleep(HOLD_CYCLES)
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
    """Median µs per launch over ``iters`` held replays (``median_us``) of a graph holding ``launches``
    launches."""
    return median_us(graph.replay, iters, hold=True) / launches


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
